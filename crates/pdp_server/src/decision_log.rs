//! The decision log's Rust side (docs/history.md, "Durability of the decision log"): every
//! decision's record goes to an append-only spool on disk, a write-ahead log, before the
//! Python shipper (`svc.pdp.decision_log`) produces it to `svc.decisions.v1`.
//!
//! * [`DecisionLog::push`]: called per decision. The record waits in memory for the next group
//!   commit; it never waits for the broker. The returned [`Ticket`] resolves once the record
//!   is written: in [`Durability::Durable`] mode the server answers only then.
//! * The group-commit writer (one thread per log) writes what is waiting as one `write` every
//!   `commit_interval` (counted from the first record of the group; zero writes as soon as a
//!   record arrives, and records that arrive meanwhile share the next write), followed by an
//!   `fdatasync` when `fsync` is on. A record written to the file survives a kill of the
//!   process (the kernel has it); only `fsync` covers a power loss or a kernel crash. So a
//!   `kill -9` loses at most the records still in memory: those of the last commit window,
//!   counted by [`LogStats::queued_now`]. In durable mode answers wait for the write, so the
//!   writer gathers no window: it writes as soon as it is free, and what arrives during a
//!   write goes in the next one (group commit without a delay; a 5 ms window cut closed-loop
//!   throughput to connections / 5 ms). Before taking a group it yields the CPU once, so that
//!   on a busy core the request threads that woke it push what they have first: one write per
//!   record cost twice the CPU per decision (docs/benchmarks.md).
//! * [`DecisionLog::read`] / [`DecisionLog::ack`]: the shipper reads written records in spool
//!   order and acknowledges each batch once the broker has all of it. The acknowledged
//!   position (the cursor) moves over batches in order only; it is saved at most every
//!   [`CURSOR_SAVE_INTERVAL`] and at [`DecisionLog::close`], so after a crash the records
//!   acknowledged since the last save are sent again (at least once; the history loader
//!   removes duplicates by `qid`, docs/history.md "Dedup"). [`DecisionLog::rewind`] reads
//!   again from the cursor after failed deliveries.
//!
//! Nothing is dropped silently: a record is dropped only when the unacknowledged part of the
//! spool would pass `spool_max_bytes` (or the write fails), and then it is counted in
//! `dropped` and its ticket says why.
//!
//! Spool format: segment files `<20-digit sequence>.seg` in the spool directory, each a series
//! of frames `[key_len u32 LE][value_len u32 LE][crc32 u32 LE of key then value][key][value]`.
//! A torn frame at the end of the last segment (a crash mid-write) is cut off when the spool is
//! opened. The cursor is the file `cursor` (`<segment> <offset>`), replaced atomically (write,
//! rename). Segments wholly before the cursor are deleted.

use arc_swap::ArcSwapOption;
use event_listener::{Event, Listener};
use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest group-commit window accepted (`log_commit_ms` up to 1000).
pub const MAX_COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// How often, at most, the acknowledged position is saved to the `cursor` file while records
/// are being acknowledged (it is also saved at [`DecisionLog::close`]).
pub const CURSOR_SAVE_INTERVAL: Duration = Duration::from_millis(100);

/// One log record: the broker key (the principal, `Type::id`) and the JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Message key.
    pub key: Vec<u8>,
    /// Message value (the decision record's JSON, docs/history.md).
    pub value: Vec<u8>,
}

/// When a decision is answered relative to its record's group commit (`log_durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Answer at once; a kill loses at most the records of the last commit window.
    #[default]
    Window,
    /// Answer once the record is written (and fsynced when `fsync` is on); a kill loses none.
    Durable,
}

impl Durability {
    /// `window` or `durable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Window => "window",
            Self::Durable => "durable",
        }
    }

    /// Parses `window` or `durable`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "window" => Some(Self::Window),
            "durable" => Some(Self::Durable),
            _ => None,
        }
    }
}

/// Settings of a decision log (the `svc pdp` options of docs/api.md).
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Records held in memory for one group commit; when reached, the commit starts at once
    /// and further pushes wait for it (`log_queue_bound`).
    pub queue_bound: usize,
    /// Spool directory (created if missing).
    pub spool_dir: PathBuf,
    /// Largest spool, in bytes of frames not yet acknowledged; records past it are dropped and
    /// counted.
    pub spool_max_bytes: u64,
    /// Size at which a new segment is started, in bytes.
    pub segment_bytes: u64,
    /// Group-commit window, zero to [`MAX_COMMIT_INTERVAL`] (`log_commit_ms`). Window mode
    /// only: durable mode writes as soon as the writer is free (see the module docs).
    pub commit_interval: Duration,
    /// `fdatasync` the segment after every group commit (`log_fsync`).
    pub fsync: bool,
    /// When the server answers (`log_durability`).
    pub durability: Durability,
}

/// Counters of a decision log (monotonic since open, except the `*_now` / pending ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Records ever pushed.
    pub pushed: u64,
    /// Records in memory waiting for their group commit now: what a kill would lose.
    pub queued_now: u64,
    /// Records written to the spool.
    pub spooled: u64,
    /// Records acknowledged by the broker (in spool order).
    pub sent: u64,
    /// Of `sent`, records an earlier run had written (left after a crash or a stop).
    pub replayed: u64,
    /// Records dropped because the spool was full or could not be written.
    pub dropped: u64,
    /// Records in the spool not yet acknowledged.
    pub spool_pending: u64,
    /// Bytes of those records' frames.
    pub spool_pending_bytes: u64,
    /// Group commits made.
    pub commits: u64,
}

/// What one group commit did, for the metrics observer.
#[derive(Debug, Clone, Copy)]
pub struct CommitInfo {
    /// Records in the group.
    pub records: usize,
    /// Of them, records written (the rest were dropped).
    pub written: usize,
    /// Time the write (and fsync) took.
    pub duration: Duration,
}

/// Why a record was not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWritten {
    /// The unacknowledged spool would pass `spool_max_bytes` (the value).
    Full(u64),
    /// Writing the spool failed (the `io::Error` text).
    Io(String),
}

impl fmt::Display for NotWritten {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Full(max) => write!(
                f,
                "the decision-log spool is full (spool_max_bytes={max}): the broker has not \
                 acknowledged that much yet"
            ),
            Self::Io(e) => write!(f, "the decision-log spool cannot be written: {e}"),
        }
    }
}

impl std::error::Error for NotWritten {}

/// Where the spool stands: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpoolPos {
    /// Segment sequence number.
    pub segment: u64,
    /// Byte offset within the segment.
    pub offset: u64,
}

/// A batch read from the spool: its records and where it starts and ends.
#[derive(Debug)]
pub struct SpoolBatch {
    /// Records in spool order.
    pub records: Vec<Record>,
    /// Position of the first record.
    pub start: SpoolPos,
    /// Position after the last; pass the batch to [`DecisionLog::ack`] once the broker has
    /// them all.
    pub end: SpoolPos,
}

/// The outcome of one group commit, shared by the tickets of its records.
struct Group {
    done: AtomicBool,
    /// Records of the group written (a prefix: once one does not fit, the rest is dropped).
    written: AtomicUsize,
    failure: OnceLock<NotWritten>,
    event: Event,
}

impl Group {
    fn new() -> Self {
        Self {
            done: AtomicBool::new(false),
            written: AtomicUsize::new(0),
            failure: OnceLock::new(),
            event: Event::new(),
        }
    }

    fn finish(&self, written: usize, failure: Option<NotWritten>) {
        if let Some(f) = failure {
            let _ = self.failure.set(f);
        }
        self.written.store(written, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
        self.event.notify(usize::MAX);
    }

    fn wait_done(&self) {
        while !self.done.load(Ordering::Acquire) {
            let l = self.event.listen();
            if self.done.load(Ordering::Acquire) {
                break;
            }
            l.wait();
        }
    }
}

/// A pushed record's claim on its group commit: [`Ticket::written`] (async) or
/// [`Ticket::wait`] (blocking) resolve once the group is written. Waiting holds no lock.
pub struct Ticket {
    group: Arc<Group>,
    index: usize,
}

impl Ticket {
    /// `None` while the group is not written yet, else the record's outcome.
    pub fn outcome(&self) -> Option<Result<(), NotWritten>> {
        if !self.group.done.load(Ordering::Acquire) {
            return None;
        }
        if self.index < self.group.written.load(Ordering::Relaxed) {
            return Some(Ok(()));
        }
        Some(Err(self.group.failure.get().cloned().unwrap_or_else(
            || NotWritten::Io("the record was not written".to_owned()),
        )))
    }

    /// Resolves once the record's group commit is done.
    ///
    /// # Errors
    /// [`NotWritten`] when the record was dropped (spool full, write error).
    pub async fn written(self) -> Result<(), NotWritten> {
        loop {
            if let Some(r) = self.outcome() {
                return r;
            }
            let l = self.group.event.listen();
            if let Some(r) = self.outcome() {
                return r;
            }
            l.await;
        }
    }

    /// Blocks the calling thread until the record's group commit is done.
    ///
    /// # Errors
    /// As [`Ticket::written`].
    pub fn wait(self) -> Result<(), NotWritten> {
        self.group.wait_done();
        self.outcome().unwrap_or(Ok(()))
    }
}

const HEADER: usize = 12;

struct InFlight {
    start: SpoolPos,
    end: SpoolPos,
    count: u64,
    bytes: u64,
    old: u64,
    acked: bool,
}

struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    fsync: bool,
    /// Segment being appended to and its length.
    head: u64,
    head_len: u64,
    writer: Option<File>,
    /// Acknowledged position, and the one last saved to `cursor`.
    acked: SpoolPos,
    saved: SpoolPos,
    saved_at: Instant,
    /// Next position the shipper reads.
    read_pos: SpoolPos,
    /// Batches read and not acknowledged yet, in spool order.
    in_flight: VecDeque<InFlight>,
    /// End of what was in the spool when it was opened (records before it are replays).
    open_end: SpoolPos,
    pending: u64,
    pending_bytes: u64,
}

fn seg_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

fn segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".seg") {
            if let Ok(n) = stem.parse::<u64>() {
                out.push(n);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn read_frame(r: &mut impl Read) -> io::Result<Option<(Record, u64)>> {
    let mut h = [0u8; HEADER];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let word = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(h.get(i..i + 4).unwrap_or(&[0; 4]));
        u32::from_le_bytes(b)
    };
    let (kl, vl, crc) = (word(0) as usize, word(4) as usize, word(8));
    let mut key = vec![0u8; kl];
    let mut value = vec![0u8; vl];
    if r.read_exact(&mut key).is_err() || r.read_exact(&mut value).is_err() {
        return Ok(None);
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&key);
    hasher.update(&value);
    if hasher.finalize() != crc {
        return Ok(None);
    }
    Ok(Some((Record { key, value }, (HEADER + kl + vl) as u64)))
}

fn frame(rec: &Record, out: &mut Vec<u8>) {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&rec.key);
    hasher.update(&rec.value);
    out.extend_from_slice(
        &u32::try_from(rec.key.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(
        &u32::try_from(rec.value.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.extend_from_slice(&rec.key);
    out.extend_from_slice(&rec.value);
}

impl Spool {
    fn open(cfg: &LogConfig) -> io::Result<Self> {
        let dir = cfg.spool_dir.as_path();
        fs::create_dir_all(dir)?;
        let segs = segments(dir)?;
        let first = SpoolPos {
            segment: segs.first().copied().unwrap_or(0),
            offset: 0,
        };
        // A cursor that cannot be read (a crash between write and rename on a file system
        // that lost it) replays from the first segment: duplicates, never a loss.
        let cursor = match fs::read_to_string(dir.join("cursor")) {
            Ok(s) => {
                let mut it = s.split_whitespace().map(str::parse::<u64>);
                match (it.next(), it.next()) {
                    (Some(Ok(segment)), Some(Ok(offset))) => SpoolPos { segment, offset },
                    _ => first,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => first,
            Err(e) => return Err(e),
        };
        let head = segs
            .last()
            .copied()
            .unwrap_or(cursor.segment)
            .max(cursor.segment);
        let mut sp = Self {
            dir: dir.to_path_buf(),
            max_bytes: cfg.spool_max_bytes,
            segment_bytes: cfg.segment_bytes.max(1),
            fsync: cfg.fsync,
            head,
            head_len: 0,
            writer: None,
            acked: cursor,
            saved: cursor,
            saved_at: Instant::now(),
            read_pos: cursor,
            in_flight: VecDeque::new(),
            open_end: cursor,
            pending: 0,
            pending_bytes: 0,
        };
        // Count what is left to send; cut a torn frame off the last segment.
        for &seq in &segs {
            if seq < cursor.segment {
                let _ = fs::remove_file(seg_path(dir, seq));
                continue;
            }
            let path = seg_path(dir, seq);
            let mut f = File::open(&path)?;
            let mut pos = 0u64;
            if seq == cursor.segment {
                f.seek(SeekFrom::Start(cursor.offset))?;
                pos = cursor.offset;
            }
            let mut r = BufReader::new(f);
            while let Some((_, n)) = read_frame(&mut r)? {
                pos += n;
                sp.pending += 1;
                sp.pending_bytes += n;
            }
            let len = fs::metadata(&path)?.len();
            if pos < len && seq == sp.head {
                OpenOptions::new().write(true).open(&path)?.set_len(pos)?;
            }
            if seq == sp.head {
                sp.head_len = pos.min(len);
            }
        }
        sp.open_end = sp.end();
        Ok(sp)
    }

    /// Position after the last written frame.
    fn end(&self) -> SpoolPos {
        SpoolPos {
            segment: self.head,
            offset: self.head_len,
        }
    }

    /// Opens the head segment for appending, starting a new one when it is full.
    fn writer(&mut self) -> io::Result<&mut File> {
        if self.writer.is_none() || self.head_len >= self.segment_bytes {
            if self.writer.is_some() {
                self.head += 1;
                self.head_len = 0;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(seg_path(&self.dir, self.head))?;
            self.head_len = f.metadata()?.len();
            self.writer = Some(f);
        }
        self.writer
            .as_mut()
            .ok_or_else(|| io::Error::other("spool writer missing"))
    }

    /// Frames `recs` and appends, in one write, those that fit under `max_bytes` (a prefix:
    /// once one does not fit, the rest is dropped, so the spool keeps push order). Returns how
    /// many were written.
    fn append(&mut self, recs: &[Record]) -> io::Result<usize> {
        let mut buf = Vec::new();
        let mut written = 0usize;
        for r in recs {
            let n = (HEADER + r.key.len() + r.value.len()) as u64;
            if self.pending_bytes + (buf.len() as u64) + n > self.max_bytes {
                break;
            }
            frame(r, &mut buf);
            written += 1;
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let sync = self.fsync;
        self.writer()?;
        let len = self.head_len;
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| io::Error::other("spool writer missing"))?;
        let res = w
            .write_all(&buf)
            .and_then(|()| if sync { w.sync_data() } else { Ok(()) });
        if let Err(e) = res {
            // Cut a partial write off, so the frames after it stay readable.
            let _ = w.set_len(len);
            return Err(e);
        }
        self.head_len += buf.len() as u64;
        self.pending += written as u64;
        self.pending_bytes += buf.len() as u64;
        Ok(written)
    }

    /// Reads up to `max` written records from the read position and moves it past them.
    fn read(&mut self, max: usize) -> io::Result<SpoolBatch> {
        let start = self.read_pos;
        let mut records = Vec::new();
        let mut pos = start;
        let (mut bytes, mut old) = (0u64, 0u64);
        while records.len() < max && pos < self.end() {
            let path = seg_path(&self.dir, pos.segment);
            let mut f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound && pos.segment < self.head => {
                    pos = SpoolPos {
                        segment: pos.segment + 1,
                        offset: 0,
                    };
                    continue;
                }
                Err(e) => return Err(e),
            };
            f.seek(SeekFrom::Start(pos.offset))?;
            // Never past what the writer has written (a write in progress is not read).
            let limit = if pos.segment == self.head {
                self.head_len.saturating_sub(pos.offset)
            } else {
                u64::MAX
            };
            let mut r = BufReader::new(f.take(limit));
            let mut exhausted = true;
            while records.len() < max {
                let before = pos;
                match read_frame(&mut r)? {
                    Some((rec, n)) => {
                        records.push(rec);
                        pos.offset += n;
                        bytes += n;
                        if before < self.open_end {
                            old += 1;
                        }
                    }
                    None => break,
                }
                if records.len() == max {
                    exhausted = false;
                }
            }
            if exhausted && pos.segment < self.head {
                pos = SpoolPos {
                    segment: pos.segment + 1,
                    offset: 0,
                };
            } else {
                break;
            }
        }
        self.read_pos = pos;
        if !records.is_empty() {
            self.in_flight.push_back(InFlight {
                start,
                end: pos,
                count: records.len() as u64,
                bytes,
                old,
                acked: false,
            });
        }
        Ok(SpoolBatch {
            records,
            start,
            end: pos,
        })
    }

    /// Marks `batch` acknowledged and moves the cursor over every acknowledged batch at the
    /// front. Returns the (records, replayed records) the cursor passed.
    fn ack(&mut self, batch: &SpoolBatch) -> io::Result<(u64, u64)> {
        if let Some(b) = self
            .in_flight
            .iter_mut()
            .find(|b| b.start == batch.start && b.end == batch.end)
        {
            b.acked = true;
        }
        let (mut sent, mut replayed) = (0u64, 0u64);
        while self.in_flight.front().is_some_and(|b| b.acked) {
            if let Some(b) = self.in_flight.pop_front() {
                self.acked = b.end;
                self.pending = self.pending.saturating_sub(b.count);
                self.pending_bytes = self.pending_bytes.saturating_sub(b.bytes);
                sent += b.count;
                replayed += b.old;
            }
        }
        let passed_segment = self.acked.segment > self.saved.segment;
        if passed_segment || self.saved_at.elapsed() >= CURSOR_SAVE_INTERVAL {
            self.save_cursor()?;
        }
        Ok((sent, replayed))
    }

    /// Saves the acknowledged position (write, rename), then deletes the segments before it.
    fn save_cursor(&mut self) -> io::Result<()> {
        if self.acked == self.saved {
            return Ok(());
        }
        let tmp = self.dir.join("cursor.tmp");
        {
            let mut f = File::create(&tmp)?;
            writeln!(f, "{} {}", self.acked.segment, self.acked.offset)?;
            if self.fsync {
                f.sync_all()?;
            }
        }
        fs::rename(&tmp, self.dir.join("cursor"))?;
        for seq in self.saved.segment..self.acked.segment {
            let _ = fs::remove_file(seg_path(&self.dir, seq));
        }
        self.saved = self.acked;
        self.saved_at = Instant::now();
        Ok(())
    }
}

/// Records waiting for the next group commit.
struct Pending {
    records: Vec<Record>,
    /// When the group's first record arrived (its window ends `commit_interval` later).
    first_at: Option<Instant>,
    /// The outcome the group's records will share.
    group: Arc<Group>,
    /// The group being written now, if any.
    writing: Option<Arc<Group>>,
    /// Write at once (a flush was asked for).
    flush: bool,
    /// The writer is to write what is left and stop.
    closing: bool,
}

type Observer = Box<dyn Fn(&CommitInfo) + Send + Sync>;

struct Inner {
    pending: Mutex<Pending>,
    /// The writer waits here for records, its window's end, a flush or the close.
    arrived: Condvar,
    /// Pushers wait here while `queue_bound` records are waiting.
    space: Condvar,
    bound: usize,
    interval: Duration,
    durability: Durability,
    fsync: bool,
    spool: Mutex<Spool>,
    /// The shipper waits here (with `spool`) for written records.
    readable: Condvar,
    observer: ArcSwapOption<Observer>,
    pushed: AtomicU64,
    spooled: AtomicU64,
    sent: AtomicU64,
    replayed: AtomicU64,
    dropped: AtomicU64,
    commits: AtomicU64,
    io_errors: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wait<'a, T>(c: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    c.wait(g).unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn wait_timeout<'a, T>(c: &Condvar, g: MutexGuard<'a, T>, d: Duration) -> MutexGuard<'a, T> {
    c.wait_timeout(g, d)
        .map(|(g, _)| g)
        .unwrap_or_else(|e| e.into_inner().0)
}

impl Inner {
    /// Writes one group and resolves its tickets.
    fn commit(&self, records: &[Record], group: &Group) {
        let start = Instant::now();
        let res = lock(&self.spool).append(records);
        let duration = start.elapsed();
        let (written, failure) = match res {
            Ok(n) if n == records.len() => (n, None),
            Ok(n) => {
                let max = lock(&self.spool).max_bytes;
                (n, Some(NotWritten::Full(max)))
            }
            Err(e) => {
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                (0, Some(NotWritten::Io(e.to_string())))
            }
        };
        self.spooled.fetch_add(written as u64, Ordering::Relaxed);
        self.dropped
            .fetch_add((records.len() - written) as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        group.finish(written, failure);
        self.readable.notify_all();
        if let Some(f) = self.observer.load().as_ref() {
            f(&CommitInfo {
                records: records.len(),
                written,
                duration,
            });
        }
    }

    /// The group-commit writer's loop (see the module docs).
    fn run_writer(&self) {
        let mut p = lock(&self.pending);
        loop {
            if p.records.is_empty() {
                if p.closing {
                    return;
                }
                p = wait(&self.arrived, p);
                continue;
            }
            if !p.closing && !p.flush && p.records.len() < self.bound {
                let deadline = p.first_at.unwrap_or_else(Instant::now) + self.interval;
                let now = Instant::now();
                if now < deadline {
                    p = wait_timeout(&self.arrived, p, deadline - now);
                    continue;
                }
            }
            if self.interval.is_zero() && !p.closing {
                // Let the threads that woke us push what they have before this write takes
                // it: on a busy core, one write then carries several records, not one.
                drop(p);
                std::thread::yield_now();
                p = lock(&self.pending);
            }
            let records = std::mem::take(&mut p.records);
            let group = std::mem::replace(&mut p.group, Arc::new(Group::new()));
            p.first_at = None;
            p.flush = false;
            p.writing = Some(group.clone());
            drop(p);
            self.space.notify_all();
            self.commit(&records, &group);
            p = lock(&self.pending);
            p.writing = None;
        }
    }
}

/// The decision log's spool and group-commit writer (see the module docs). Cheap to share
/// (`Sync`); dropping it closes it ([`DecisionLog::close`]).
pub struct DecisionLog {
    inner: Arc<Inner>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl DecisionLog {
    /// Opens the log: creates the spool directory, counts what it holds (records an earlier
    /// run left unacknowledged are read first), cuts a torn last frame, and starts the
    /// group-commit writer thread.
    ///
    /// # Errors
    /// `InvalidInput` when `commit_interval` is over [`MAX_COMMIT_INTERVAL`]; the `io::Error`
    /// of creating or reading the spool directory or of starting the thread.
    pub fn open(cfg: &LogConfig) -> io::Result<Self> {
        if cfg.commit_interval > MAX_COMMIT_INTERVAL {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "log_commit_ms={} is over the limit of {} ms",
                    cfg.commit_interval.as_millis(),
                    MAX_COMMIT_INTERVAL.as_millis()
                ),
            ));
        }
        let inner = Arc::new(Inner {
            pending: Mutex::new(Pending {
                records: Vec::new(),
                first_at: None,
                group: Arc::new(Group::new()),
                writing: None,
                flush: false,
                closing: false,
            }),
            arrived: Condvar::new(),
            space: Condvar::new(),
            bound: cfg.queue_bound.max(1),
            interval: match cfg.durability {
                Durability::Window => cfg.commit_interval,
                Durability::Durable => Duration::ZERO,
            },
            durability: cfg.durability,
            fsync: cfg.fsync,
            spool: Mutex::new(Spool::open(cfg)?),
            readable: Condvar::new(),
            observer: ArcSwapOption::empty(),
            pushed: AtomicU64::new(0),
            spooled: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
        });
        let w = inner.clone();
        let handle = std::thread::Builder::new()
            .name("svc-log-writer".into())
            .spawn(move || w.run_writer())?;
        Ok(Self {
            inner,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Queues one record for the next group commit and returns its ticket. Never waits for
    /// the broker; waits for the writer only while `queue_bound` records are already waiting.
    /// After [`DecisionLog::close`] the record is written at once, by the caller.
    pub fn push(&self, rec: Record) -> Ticket {
        let inner = &self.inner;
        inner.pushed.fetch_add(1, Ordering::Relaxed);
        let mut p = lock(&inner.pending);
        while p.records.len() >= inner.bound && !p.closing {
            inner.arrived.notify_one();
            p = wait(&inner.space, p);
        }
        if p.closing {
            drop(p);
            let group = Arc::new(Group::new());
            inner.commit(std::slice::from_ref(&rec), &group);
            return Ticket { group, index: 0 };
        }
        let first = p.records.is_empty();
        if first {
            p.first_at = Some(Instant::now());
        }
        let index = p.records.len();
        p.records.push(rec);
        let ticket = Ticket {
            group: p.group.clone(),
            index,
        };
        let wake = first || p.records.len() >= inner.bound;
        drop(p);
        if wake {
            inner.arrived.notify_one();
        }
        ticket
    }

    /// Writes what is waiting now, without waiting for the window, and returns once every
    /// record pushed before the call is written (or dropped).
    pub fn flush(&self) {
        let inner = &self.inner;
        let mut p = lock(&inner.pending);
        let target = if p.records.is_empty() {
            p.writing.clone()
        } else {
            p.flush = true;
            Some(p.group.clone())
        };
        drop(p);
        inner.arrived.notify_one();
        if let Some(g) = target {
            g.wait_done();
        }
    }

    /// Writes what is waiting, stops the writer thread and saves the cursor. Later pushes are
    /// written by their caller. Calling it twice is harmless.
    ///
    /// # Errors
    /// The `io::Error` of saving the cursor.
    pub fn close(&self) -> io::Result<()> {
        lock(&self.inner.pending).closing = true;
        self.inner.arrived.notify_one();
        let handle = lock(&self.writer).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        lock(&self.inner.spool).save_cursor()
    }

    /// Reads up to `max` written records in spool order from the read position, waiting up to
    /// `timeout` for the first; the batch is empty when none came. Acknowledge it with
    /// [`DecisionLog::ack`] once the broker has all of it.
    ///
    /// # Errors
    /// The `io::Error` of reading a segment.
    pub fn read(&self, max: usize, timeout: Duration) -> io::Result<SpoolBatch> {
        let deadline = Instant::now() + timeout;
        let mut sp = lock(&self.inner.spool);
        while sp.read_pos >= sp.end() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            sp = wait_timeout(&self.inner.readable, sp, deadline - now);
        }
        sp.read(max.max(1))
    }

    /// Records that the broker acknowledged every record of `batch`. The cursor moves past it
    /// once every batch read before it is acknowledged too; a batch from before a
    /// [`DecisionLog::rewind`] is ignored.
    ///
    /// # Errors
    /// The `io::Error` of saving the cursor (the records stay acknowledged in memory).
    pub fn ack(&self, batch: &SpoolBatch) -> io::Result<()> {
        let (sent, replayed) = lock(&self.inner.spool).ack(batch)?;
        self.inner.sent.fetch_add(sent, Ordering::Relaxed);
        self.inner.replayed.fetch_add(replayed, Ordering::Relaxed);
        Ok(())
    }

    /// Forgets the batches in flight and reads again from the cursor (after deliveries failed;
    /// records already delivered are sent again).
    pub fn rewind(&self) {
        let mut sp = lock(&self.inner.spool);
        sp.read_pos = sp.acked;
        sp.in_flight.clear();
    }

    /// Calls `f` after every group commit (the server's metrics); replaces an earlier one.
    pub fn observe_commits(&self, f: impl Fn(&CommitInfo) + Send + Sync + 'static) {
        let b: Observer = Box::new(f);
        self.inner.observer.store(Some(Arc::new(b)));
    }

    /// The group-commit window in force (zero in durable mode).
    pub fn commit_interval(&self) -> Duration {
        self.inner.interval
    }

    /// When decisions are answered relative to their record's commit.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// Whether every group commit is fsynced.
    pub fn fsync(&self) -> bool {
        self.inner.fsync
    }

    /// Current counters.
    pub fn stats(&self) -> LogStats {
        let inner = &self.inner;
        let queued_now = lock(&inner.pending).records.len() as u64;
        let (spool_pending, spool_pending_bytes) = {
            let sp = lock(&inner.spool);
            (sp.pending, sp.pending_bytes)
        };
        LogStats {
            pushed: inner.pushed.load(Ordering::Relaxed),
            queued_now,
            spooled: inner.spooled.load(Ordering::Relaxed),
            sent: inner.sent.load(Ordering::Relaxed),
            replayed: inner.replayed.load(Ordering::Relaxed),
            dropped: inner.dropped.load(Ordering::Relaxed),
            spool_pending,
            spool_pending_bytes,
            commits: inner.commits.load(Ordering::Relaxed),
        }
    }

    /// Write errors of the spool so far (their records are also counted as dropped).
    pub fn io_errors(&self) -> u64 {
        self.inner.io_errors.load(Ordering::Relaxed)
    }
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn rec(i: usize) -> Record {
        Record {
            key: format!("Human::u{i}").into_bytes(),
            value: format!("{{\"qid\":\"{i}\"}}").into_bytes(),
        }
    }

    fn cfg(dir: &Path, max: u64, seg: u64, interval_ms: u64) -> LogConfig {
        LogConfig {
            queue_bound: 1000,
            spool_dir: dir.to_path_buf(),
            spool_max_bytes: max,
            segment_bytes: seg,
            commit_interval: Duration::from_millis(interval_ms),
            fsync: false,
            durability: Durability::Window,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-spool-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn read_all(log: &DecisionLog) -> Vec<Record> {
        let mut out = Vec::new();
        loop {
            let b = log.read(3, Duration::ZERO).unwrap();
            if b.records.is_empty() {
                return out;
            }
            out.extend(b.records);
        }
    }

    #[test]
    fn pushed_records_are_written_in_order_across_segments_and_read_back_after_reopen() {
        let d = tmp("order");
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 64, 0)).unwrap();
        // One group per record: a segment holds whole groups, so this makes several.
        for i in 0..10 {
            log.push(rec(i)).wait().unwrap();
        }
        let s = log.stats();
        assert_eq!(
            (s.pushed, s.queued_now, s.spooled, s.dropped),
            (10, 0, 10, 0)
        );
        assert!(
            segments(&d).unwrap().len() > 1,
            "64-byte segments: several files"
        );
        let b = log.read(4, Duration::ZERO).unwrap();
        assert_eq!(b.records, (0..4).map(rec).collect::<Vec<_>>());
        log.ack(&b).unwrap();
        log.close().unwrap();
        drop(log);
        // Reopen: the rest is still there, after the saved cursor; it counts as replayed.
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 64, 0)).unwrap();
        assert_eq!(log.stats().spool_pending, 6);
        let b = log.read(100, Duration::ZERO).unwrap();
        assert_eq!(b.records, (4..10).map(rec).collect::<Vec<_>>());
        log.ack(&b).unwrap();
        let s = log.stats();
        assert_eq!((s.spool_pending, s.sent, s.replayed), (0, 6, 6));
        assert!(log.read(100, Duration::ZERO).unwrap().records.is_empty());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_ticket_resolves_only_once_its_record_is_in_the_file() {
        let d = tmp("ticket");
        // A window of a second: the record waits in memory until flushed.
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 1000)).unwrap();
        let t = log.push(rec(1));
        assert!(t.outcome().is_none());
        assert_eq!(log.stats().queued_now, 1);
        assert!(log.read(10, Duration::ZERO).unwrap().records.is_empty());
        log.flush();
        assert_eq!(t.outcome(), Some(Ok(())));
        assert_eq!(log.stats().queued_now, 0);
        // Written means in the segment file, where another process would find it.
        let reopened = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap();
        assert_eq!(read_all(&reopened), vec![rec(1)]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn close_writes_what_waits_in_memory() {
        let d = tmp("close");
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 1000)).unwrap();
        for i in 0..5 {
            log.push(rec(i));
        }
        log.close().unwrap();
        // Pushed after close: written by the caller at once.
        log.push(rec(5)).wait().unwrap();
        drop(log);
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap();
        assert_eq!(read_all(&log), (0..6).map(rec).collect::<Vec<_>>());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_full_spool_drops_counts_and_tells_the_ticket_the_limit() {
        let d = tmp("full");
        let one = (HEADER + rec(0).key.len() + rec(0).value.len()) as u64;
        let log = DecisionLog::open(&cfg(&d, one * 2, 1 << 20, 0)).unwrap();
        let outcomes: Vec<_> = (0..3).map(|i| log.push(rec(i)).wait()).collect();
        assert_eq!(outcomes[..2], [Ok(()), Ok(())]);
        assert_eq!(outcomes[2], Err(NotWritten::Full(one * 2)));
        assert!(outcomes[2]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains(&format!("spool_max_bytes={}", one * 2)));
        assert_eq!(log.stats().dropped, 1);
        // Acknowledging makes room again.
        let b = log.read(10, Duration::ZERO).unwrap();
        log.ack(&b).unwrap();
        assert_eq!(log.push(rec(3)).wait(), Ok(()));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn acks_move_the_cursor_in_order_and_rewind_reads_again() {
        let d = tmp("acks");
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap();
        for i in 0..6 {
            log.push(rec(i)).wait().unwrap();
        }
        let a = log.read(2, Duration::ZERO).unwrap();
        let b = log.read(2, Duration::ZERO).unwrap();
        let c = log.read(2, Duration::ZERO).unwrap();
        // The second batch's ack alone moves nothing: the first is not acknowledged yet.
        log.ack(&b).unwrap();
        assert_eq!((log.stats().sent, log.stats().spool_pending), (0, 6));
        log.ack(&a).unwrap();
        assert_eq!((log.stats().sent, log.stats().spool_pending), (4, 2));
        // `c` failed: read again from the cursor.
        drop(c);
        log.rewind();
        let again = log.read(10, Duration::ZERO).unwrap();
        assert_eq!(again.records, vec![rec(4), rec(5)]);
        log.ack(&again).unwrap();
        assert_eq!(log.stats().spool_pending, 0);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn torn_tail_is_cut_on_open() {
        let d = tmp("torn");
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap();
        log.push(rec(1));
        log.push(rec(2)).wait().unwrap();
        drop(log);
        let seg = seg_path(&d, segments(&d).unwrap()[0]);
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[5, 0, 0, 0, 9]).unwrap();
        drop(f);
        let log = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap();
        assert_eq!(log.stats().spool_pending, 2);
        log.push(rec(3)).wait().unwrap();
        assert_eq!(read_all(&log), vec![rec(1), rec(2), rec(3)]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn read_waits_for_a_commit() {
        let d = tmp("wait");
        let log = Arc::new(DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 0)).unwrap());
        let l2 = log.clone();
        let t = std::thread::spawn(move || l2.read(10, Duration::from_secs(30)).unwrap().records);
        std::thread::sleep(Duration::from_millis(20));
        log.push(rec(1));
        assert_eq!(t.join().unwrap(), vec![rec(1)]);
        assert!(log.read(10, Duration::ZERO).unwrap().records.is_empty());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn durable_mode_writes_without_waiting_for_a_window() {
        let d = tmp("durable");
        let mut c = cfg(&d, 1 << 20, 1 << 20, 1000);
        c.durability = Durability::Durable;
        let log = DecisionLog::open(&c).unwrap();
        assert_eq!(log.commit_interval(), Duration::ZERO);
        // No flush: the writer writes as soon as it is free.
        assert_eq!(log.push(rec(1)).wait(), Ok(()));
        assert_eq!(log.stats().spooled, 1);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_window_over_the_limit_is_refused_naming_the_setting() {
        let d = tmp("limit");
        let e = DecisionLog::open(&cfg(&d, 1 << 20, 1 << 20, 1001))
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("log_commit_ms=1001"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }
}
