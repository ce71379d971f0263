//! The wall clock, in the unit decision records and challenge statuses use (milliseconds since
//! the Unix epoch).

/// Current time in milliseconds since the Unix epoch; 0 for a clock set before the epoch,
/// `u64::MAX` past what a `u64` holds.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
