//! The decision log's Rust side (SPEC 1 and 6, DESIGN 6): every decision's record waits in a
//! bounded in-memory queue until the Python shipper drains it in batches (one GIL acquisition
//! per batch) and produces it to `svc.decisions.v1`; what cannot go to the broker goes to an
//! append-only spool on disk and is replayed, in spool order, when the broker is back.
//!
//! Nothing is dropped silently: a record leaves this module only by being drained, spooled, or
//! (when the spool is full) counted in `dropped`.
//!
//! * [`DecisionLog::push`]: called per decision, never blocks on the broker. When the queue is
//!   full (the shipper is stalled), the record is spooled directly.
//! * [`DecisionLog::drain`]: the shipper takes up to `max` records, waiting up to `timeout` for
//!   the first one.
//! * [`DecisionLog::spool`]: the shipper hands back records the broker could not take.
//! * [`DecisionLog::spool_read`] / [`DecisionLog::spool_commit`]: replay. Records are read from
//!   the committed position; the position moves only when the shipper commits, after the broker
//!   acknowledged them, so a crash mid-replay replays again (at least once; the history loader
//!   removes duplicates by `qid`).
//!
//! Spool format: segment files `<20-digit sequence>.seg` in the spool directory, each a series
//! of frames `[key_len u32 LE][value_len u32 LE][crc32 u32 LE of key then value][key][value]`.
//! A torn frame at the end of the last segment (a crash mid-write) is cut off when the spool is
//! opened. The replay position is the file `cursor` (`<segment> <offset>`), replaced atomically
//! (write, fsync, rename). Segments wholly before the position are deleted.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One log record: the broker key (the principal, `Type::id`) and the JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Message key.
    pub key: Vec<u8>,
    /// Message value (the record JSON of DESIGN 6).
    pub value: Vec<u8>,
}

/// Settings of a decision log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Records held in memory before new ones go straight to the spool.
    pub queue_bound: usize,
    /// Spool directory (created if missing).
    pub spool_dir: PathBuf,
    /// Largest spool, in bytes of unreplayed frames; records past it are dropped and counted.
    pub spool_max_bytes: u64,
    /// Size at which a new segment is started, in bytes.
    pub segment_bytes: u64,
}

/// Counters of a decision log (monotonic since open, except the `*_now` / pending ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Records ever pushed.
    pub pushed: u64,
    /// Records in the in-memory queue now.
    pub queued_now: u64,
    /// Records the shipper reported as acknowledged by the broker.
    pub sent: u64,
    /// Records ever written to the spool.
    pub spooled: u64,
    /// Records replayed from the spool and committed.
    pub replayed: u64,
    /// Records dropped because the spool was full.
    pub dropped: u64,
    /// Records in the spool not yet replayed.
    pub spool_pending: u64,
    /// Bytes of those records' frames.
    pub spool_pending_bytes: u64,
}

/// Where replay stands: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpoolPos {
    /// Segment sequence number.
    pub segment: u64,
    /// Byte offset within the segment.
    pub offset: u64,
}

/// A batch read from the spool: its records and the position after them.
#[derive(Debug)]
pub struct SpoolBatch {
    /// Records in spool order.
    pub records: Vec<Record>,
    /// Pass to [`DecisionLog::spool_commit`] once the broker has them all.
    pub end: SpoolPos,
    bytes: u64,
}

const HEADER: usize = 12;

struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_bytes: u64,
    /// Segment being appended to and its length.
    head: u64,
    head_len: u64,
    writer: Option<File>,
    /// Committed replay position.
    cursor: SpoolPos,
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
    fn open(dir: &Path, max_bytes: u64, segment_bytes: u64) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let segs = segments(dir)?;
        let cursor = match fs::read_to_string(dir.join("cursor")) {
            Ok(s) => {
                let mut it = s.split_whitespace().map(str::parse::<u64>);
                match (it.next(), it.next()) {
                    (Some(Ok(segment)), Some(Ok(offset))) => SpoolPos { segment, offset },
                    _ => SpoolPos {
                        segment: segs.first().copied().unwrap_or(0),
                        offset: 0,
                    },
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => SpoolPos {
                segment: segs.first().copied().unwrap_or(0),
                offset: 0,
            },
            Err(e) => return Err(e),
        };
        let mut sp = Self {
            dir: dir.to_path_buf(),
            max_bytes,
            segment_bytes: segment_bytes.max(1),
            head: segs.last().copied().unwrap_or(cursor.segment),
            head_len: 0,
            writer: None,
            cursor,
            pending: 0,
            pending_bytes: 0,
        };
        // Count what is left to replay; cut a torn frame off the last segment.
        for &seq in &segs {
            if seq < cursor.segment {
                let _ = fs::remove_file(seg_path(dir, seq));
                continue;
            }
            let path = seg_path(dir, seq);
            let mut r = BufReader::new(File::open(&path)?);
            let mut pos = 0u64;
            if seq == cursor.segment {
                r.seek(SeekFrom::Start(cursor.offset))?;
                pos = cursor.offset;
            }
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
        Ok(sp)
    }

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

    /// Appends what fits; returns (spooled, dropped).
    fn append(&mut self, recs: &[Record], sync: bool) -> io::Result<(u64, u64)> {
        let mut buf = Vec::new();
        let (mut spooled, mut dropped) = (0u64, 0u64);
        for r in recs {
            let n = (HEADER + r.key.len() + r.value.len()) as u64;
            if self.pending_bytes + (buf.len() as u64) + n > self.max_bytes {
                dropped += 1;
                continue;
            }
            frame(r, &mut buf);
            spooled += 1;
        }
        if !buf.is_empty() {
            let w = self.writer()?;
            w.write_all(&buf)?;
            if sync {
                w.sync_data()?;
            }
            self.head_len += buf.len() as u64;
            self.pending += spooled;
            self.pending_bytes += buf.len() as u64;
        }
        Ok((spooled, dropped))
    }

    fn read(&mut self, max: usize) -> io::Result<SpoolBatch> {
        let mut records = Vec::new();
        let mut pos = self.cursor;
        let mut bytes = 0u64;
        if let Some(w) = self.writer.as_mut() {
            w.flush()?;
        }
        while records.len() < max && pos.segment <= self.head {
            let path = seg_path(&self.dir, pos.segment);
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if pos.segment == self.head {
                        break;
                    }
                    pos = SpoolPos {
                        segment: pos.segment + 1,
                        offset: 0,
                    };
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut r = BufReader::new(f);
            r.seek(SeekFrom::Start(pos.offset))?;
            let mut exhausted = true;
            while records.len() < max {
                match read_frame(&mut r)? {
                    Some((rec, n)) => {
                        records.push(rec);
                        pos.offset += n;
                        bytes += n;
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
        Ok(SpoolBatch {
            records,
            end: pos,
            bytes,
        })
    }

    fn commit(&mut self, batch: &SpoolBatch) -> io::Result<()> {
        if batch.end <= self.cursor {
            return Ok(());
        }
        let tmp = self.dir.join("cursor.tmp");
        {
            let mut f = File::create(&tmp)?;
            writeln!(f, "{} {}", batch.end.segment, batch.end.offset)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, self.dir.join("cursor"))?;
        for seq in self.cursor.segment..batch.end.segment {
            let _ = fs::remove_file(seg_path(&self.dir, seq));
        }
        self.cursor = batch.end;
        self.pending = self.pending.saturating_sub(batch.records.len() as u64);
        self.pending_bytes = self.pending_bytes.saturating_sub(batch.bytes);
        Ok(())
    }
}

/// The decision log's queue and spool (see the module docs). Cheap to share (`Sync`).
pub struct DecisionLog {
    queue: Mutex<VecDeque<Record>>,
    ready: Condvar,
    bound: usize,
    spool: Mutex<Spool>,
    pushed: AtomicU64,
    sent: AtomicU64,
    spooled: AtomicU64,
    replayed: AtomicU64,
    dropped: AtomicU64,
    io_errors: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DecisionLog {
    /// Opens the log: creates the spool directory, counts what it holds, cuts a torn last
    /// frame.
    ///
    /// # Errors
    /// The `io::Error` of creating or reading the spool directory.
    pub fn open(cfg: &LogConfig) -> io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            bound: cfg.queue_bound.max(1),
            spool: Mutex::new(Spool::open(
                &cfg.spool_dir,
                cfg.spool_max_bytes,
                cfg.segment_bytes,
            )?),
            pushed: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            spooled: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
        })
    }

    /// Queues one record. When the queue is full the record goes to the spool instead (and is
    /// dropped, counted, only if the spool is full or cannot be written).
    pub fn push(&self, rec: Record) {
        self.pushed.fetch_add(1, Ordering::Relaxed);
        let mut q = lock(&self.queue);
        if q.len() < self.bound {
            q.push_back(rec);
            drop(q);
            self.ready.notify_one();
            return;
        }
        drop(q);
        self.spool_inner(std::slice::from_ref(&rec), false);
    }

    /// Takes up to `max` records in arrival order, waiting up to `timeout` for the first.
    pub fn drain(&self, max: usize, timeout: Duration) -> Vec<Record> {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.queue);
        while q.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            q = self
                .ready
                .wait_timeout(q, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    fn spool_inner(&self, recs: &[Record], sync: bool) -> u64 {
        let res = lock(&self.spool).append(recs, sync);
        match res {
            Ok((s, d)) => {
                self.spooled.fetch_add(s, Ordering::Relaxed);
                self.dropped.fetch_add(d, Ordering::Relaxed);
                s
            }
            Err(_) => {
                self.io_errors.fetch_add(1, Ordering::Relaxed);
                self.dropped.fetch_add(recs.len() as u64, Ordering::Relaxed);
                0
            }
        }
    }

    /// Writes records the broker could not take to the spool (fsynced); returns how many were
    /// spooled (the rest were dropped for want of space, and counted).
    pub fn spool(&self, recs: &[Record]) -> u64 {
        self.spool_inner(recs, true)
    }

    /// Reads up to `max` spooled records from the committed position, without moving it.
    ///
    /// # Errors
    /// The `io::Error` of reading a segment.
    pub fn spool_read(&self, max: usize) -> io::Result<SpoolBatch> {
        lock(&self.spool).read(max)
    }

    /// Moves the replay position past `batch` (the broker acknowledged it all) and deletes
    /// segments wholly replayed.
    ///
    /// # Errors
    /// The `io::Error` of writing the cursor file.
    pub fn spool_commit(&self, batch: &SpoolBatch) -> io::Result<()> {
        lock(&self.spool).commit(batch)?;
        self.replayed
            .fetch_add(batch.records.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Counts `n` records the broker acknowledged (the shipper reports them).
    pub fn mark_sent(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
    }

    /// Current counters.
    pub fn stats(&self) -> LogStats {
        let queued_now = lock(&self.queue).len() as u64;
        let sp = lock(&self.spool);
        LogStats {
            pushed: self.pushed.load(Ordering::Relaxed),
            queued_now,
            sent: self.sent.load(Ordering::Relaxed),
            spooled: self.spooled.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            spool_pending: sp.pending,
            spool_pending_bytes: sp.pending_bytes,
        }
    }

    /// Write errors of the spool so far (each also counted as dropped records).
    pub fn io_errors(&self) -> u64 {
        self.io_errors.load(Ordering::Relaxed)
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

    fn cfg(dir: &Path, bound: usize, max: u64, seg: u64) -> LogConfig {
        LogConfig {
            queue_bound: bound,
            spool_dir: dir.to_path_buf(),
            spool_max_bytes: max,
            segment_bytes: seg,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-spool-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn overflow_spools_and_replays_in_order_across_segments_and_reopen() {
        let d = tmp("order");
        let log = DecisionLog::open(&cfg(&d, 3, 1 << 20, 64)).unwrap();
        for i in 0..10 {
            log.push(rec(i));
        }
        let s = log.stats();
        assert_eq!(
            (s.pushed, s.queued_now, s.spooled, s.dropped),
            (10, 3, 7, 0)
        );
        let drained = log.drain(100, Duration::from_millis(1));
        assert_eq!(drained, (0..3).map(rec).collect::<Vec<_>>());
        let b = log.spool_read(4).unwrap();
        assert_eq!(b.records, (3..7).map(rec).collect::<Vec<_>>());
        log.spool_commit(&b).unwrap();
        drop(log);
        // Reopen: the rest is still there, from the committed position.
        let log = DecisionLog::open(&cfg(&d, 3, 1 << 20, 64)).unwrap();
        assert_eq!(log.stats().spool_pending, 3);
        let b = log.spool_read(100).unwrap();
        assert_eq!(b.records, (7..10).map(rec).collect::<Vec<_>>());
        log.spool_commit(&b).unwrap();
        assert_eq!(log.stats().spool_pending, 0);
        assert!(log.spool_read(100).unwrap().records.is_empty());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn full_spool_drops_and_counts() {
        let d = tmp("full");
        let one = (HEADER + rec(0).key.len() + rec(0).value.len()) as u64;
        let log = DecisionLog::open(&cfg(&d, 1, one * 2, 1 << 20)).unwrap();
        let n = log.spool(&(0..5).map(rec).collect::<Vec<_>>());
        assert_eq!(n, 2);
        assert_eq!(log.stats().dropped, 3);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn torn_tail_is_cut_on_open() {
        let d = tmp("torn");
        let log = DecisionLog::open(&cfg(&d, 1, 1 << 20, 1 << 20)).unwrap();
        log.spool(&[rec(1), rec(2)]);
        drop(log);
        let seg = seg_path(&d, segments(&d).unwrap()[0]);
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(&[5, 0, 0, 0, 9]).unwrap();
        drop(f);
        let log = DecisionLog::open(&cfg(&d, 1, 1 << 20, 1 << 20)).unwrap();
        assert_eq!(log.stats().spool_pending, 2);
        log.spool(&[rec(3)]);
        let b = log.spool_read(10).unwrap();
        assert_eq!(b.records, vec![rec(1), rec(2), rec(3)]);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn drain_waits_for_a_record() {
        let d = tmp("wait");
        let log = std::sync::Arc::new(DecisionLog::open(&cfg(&d, 10, 1 << 20, 1 << 20)).unwrap());
        let l2 = log.clone();
        let t = std::thread::spawn(move || l2.drain(10, Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(20));
        log.push(rec(1));
        assert_eq!(t.join().unwrap(), vec![rec(1)]);
        assert!(log.drain(10, Duration::from_millis(1)).is_empty());
        let _ = fs::remove_dir_all(&d);
    }
}
