//! Lines on standard error that a failing dependency cannot turn into a flood.
//!
//! A failure that repeats on every request (the challenge service away, the context service
//! refusing fetches) would otherwise write one line per request. [`warn`] writes the first line
//! of a kind at once, then at most one line of that kind per [`EVERY`], saying how many it left
//! out meanwhile: the rule the control plane's followers keep for a feed that fails the same
//! way again (`svc.pdp.feeds`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often a line of one kind may be written.
pub const EVERY: Duration = Duration::from_secs(60);

/// Per kind: when its last line was written, and how many were left out since.
fn book() -> &'static Mutex<HashMap<&'static str, (Instant, u64)>> {
    static BOOK: OnceLock<Mutex<HashMap<&'static str, (Instant, u64)>>> = OnceLock::new();
    BOOK.get_or_init(|| Mutex::new(HashMap::new()))
}

/// What to write for one line of `kind` at `now`: `Some(left out before it)` when it is
/// written, `None` when it is left out (counted). Kinds are a fixed set of literals, so the
/// book stays as small as the code's call sites.
fn admit(kind: &'static str, now: Instant) -> Option<u64> {
    let mut book = book()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match book.get_mut(kind) {
        Some((at, skipped)) if now.duration_since(*at) < EVERY => {
            *skipped += 1;
            None
        }
        Some((at, skipped)) => {
            let left_out = *skipped;
            (*at, *skipped) = (now, 0);
            Some(left_out)
        }
        None => {
            book.insert(kind, (now, 0));
            Some(0)
        }
    }
}

/// Writes `svc pdp: <line>` to standard error unless a line of `kind` was written within
/// [`EVERY`]; a written line says how many of its kind were left out before it.
///
/// `kind` names the failure (`"challenge-resolve"`), not the instance: lines that differ only
/// in a decision id share it.
pub fn warn(kind: &'static str, line: impl std::fmt::Display) {
    match admit(kind, Instant::now()) {
        Some(0) => eprintln!("svc pdp: {line}"),
        Some(n) => eprintln!("svc pdp: {line} ({n} more like this left out)"),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_written_once_per_period_and_counts_what_it_left_out() {
        let t0 = Instant::now();
        assert_eq!(admit("test-a", t0), Some(0));
        assert_eq!(admit("test-a", t0 + Duration::from_secs(1)), None);
        assert_eq!(admit("test-a", t0 + Duration::from_secs(2)), None);
        // Another kind is not held back by the first.
        assert_eq!(admit("test-b", t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(
            admit("test-a", t0 + EVERY + Duration::from_secs(1)),
            Some(2)
        );
        assert_eq!(admit("test-a", t0 + EVERY + Duration::from_secs(2)), None);
    }
}
