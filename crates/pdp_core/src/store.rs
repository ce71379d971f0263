//! The in-memory entity store: principals, groups, resources, work items, containments,
//! service-account registrations and risk scores
//! (docs/architecture.md#what-the-decision-point-keeps-in-memory).
//!
//! A writer clones the store cheaply, changes its copy and publishes it with one atomic pointer
//! swap: checks that already started keep the snapshot they began with, and no check ever sees
//! half an update. The large maps are [`Layered`]: a flat hash table shared by every snapshot,
//! under a small persistent map of the writes made since the table was built.

use crate::error::{chain, RequestError};
use crate::limits::{self, DepthCheck, TooDeep};
use crate::maps::{FastHasher, FastMap, PMap, PSet};
use crate::request::parse_uid;
use cedar_policy::{Entities, Entity, EntityUid, EvalResult, Schema};
use cedar_policy_core::ast;
use cedar_policy_core::entities::{Entities as CoreEntities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use serde_json::Value;
use smallvec::SmallVec;
use smol_str::SmolStr;
use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, LazyLock};

/// Writes an overlay holds before [`Layered::settle`] folds it into a new base, at least.
const OVERLAY_MIN: usize = 1024;
/// ... and at most this fraction of the base (1/16): folding copies the base, so each write
/// pays for at most 16 copied entries.
const OVERLAY_SHARE: usize = 16;

/// The flat hash table under a [`Layered`] map: built once from its entries, then only read.
pub(crate) trait FlatTable<K, V>: Default {
    /// A table of `entries`; of two entries with one key, the later wins.
    fn with_entries(entries: Vec<(K, V)>) -> Self;
    /// The value of `k`, if present.
    fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
    /// Every entry, in no particular order.
    fn entries<'a>(&'a self) -> impl Iterator<Item = (&'a K, &'a V)>
    where
        K: 'a,
        V: 'a;
    /// Number of entries.
    fn len(&self) -> usize;
}

impl<K: Hash + Eq, V> FlatTable<K, V> for FastMap<K, V> {
    fn with_entries(entries: Vec<(K, V)>) -> Self {
        let mut m = FastMap::with_capacity_and_hasher(entries.len(), FastHasher::default());
        m.extend(entries);
        m
    }

    fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        std::collections::HashMap::get(self, k)
    }

    fn entries<'a>(&'a self) -> impl Iterator<Item = (&'a K, &'a V)>
    where
        K: 'a,
        V: 'a,
    {
        self.iter()
    }

    fn len(&self) -> usize {
        std::collections::HashMap::len(self)
    }
}

/// One ancestor of a [`ClosedEntity`]: the hash of its uid ([`uid_hash`]) and the uid itself, in
/// one allocation shared by every entity of the snapshot with this ancestor.
type Ancestor = (u64, Arc<ast::EntityUID>);

/// Ancestors a [`ClosedEntity`] holds in its own allocation; more go to a separate one.
const INLINE_ANCESTORS: usize = 4;

/// Attributes a [`ClosedEntity`] holds in its own allocation; more go to a separate one.
const INLINE_ATTRS: usize = 2;

/// Most entity elements of a set attribute that a [`ClosedEntity`] files by hash
/// ([`Attr::uids`]); a bigger set is searched through Cedar's own hash set.
const MAX_FILED_UIDS: usize = 16;

/// The hasher of [`uid_hash`]: one per process, seeded at random like [`FastHasher`].
static UID_HASHER: LazyLock<FastHasher> = LazyLock::new(FastHasher::default);

/// The hash [`ClosedEntity`] files its ancestors and the entities of its small sets under, and
/// [`EntityTable`] its records: 64 bits of foldhash of the whole uid (type and id), with the
/// process's seed. Equal uids hash equal; a match is always confirmed by comparing the uids.
pub(crate) fn uid_hash(uid: &ast::EntityUID) -> u64 {
    UID_HASHER.hash_one(uid)
}

/// An attribute value read from a [`ClosedEntity`], with the [`uid_hash`] of each entity in it
/// when the record files them ([`ClosedEntity::attr_filed`]).
pub(crate) type Filed<'a> = (&'a ast::Value, Option<&'a [u64]>);

/// One attribute of a [`ClosedEntity`]: its name and value and, for a set of entities, their
/// hashes.
#[derive(Debug)]
struct Attr {
    name: SmolStr,
    /// The value Cedar's entity holds (sharing its set or record).
    value: ast::Value,
    /// For a set holding at most [`MAX_FILED_UIDS`] entity uids, the [`uid_hash`] of each, in
    /// the record itself: a uid whose hash is not among them is not in the set, which answers
    /// the usual `principal.blocked.contains(resource.owner)` without reaching Cedar's hash set
    /// behind the value (its header, then its control bytes: two dependent cache misses on a
    /// principal not in the cache). `None` for any other value or a bigger set.
    uids: Option<SmallVec<[u64; 2]>>,
}

impl Attr {
    /// The attribute `name` with `value`, its entities' hashes filed when it is a set of at
    /// most [`MAX_FILED_UIDS`] of them.
    fn new(name: SmolStr, value: ast::Value) -> Self {
        let uids = match &value.value {
            ast::ValueKind::Set(s) => {
                let uids: SmallVec<[u64; 2]> = s
                    .authoritative
                    .iter()
                    .filter_map(|v| match &v.value {
                        ast::ValueKind::Lit(ast::Literal::EntityUID(u)) => Some(uid_hash(u)),
                        _ => None,
                    })
                    .take(MAX_FILED_UIDS + 1)
                    .collect();
                (uids.len() <= MAX_FILED_UIDS).then_some(uids)
            }
            _ => None,
        };
        Self { name, value, uids }
    }
}

/// An entity as a check reads it from the snapshot: its uid, all its ancestors (the transitive
/// closure) and its attribute values in one small record, beside Cedar's entity with the same
/// closure.
///
/// Looking a principal up and asking `principal in G` are what every check does, and with
/// 100,000 principals the principal's data is rarely in the cache. In Cedar's `Entity` they
/// were a chain of dependent loads: the entity (five cache lines, its uid first), then its
/// ancestor set's control bytes, then the 120-byte uid in the matching bucket (callgrind's
/// cache simulator). Here the table compares the record's own uid, and `in` scans at most a
/// few ancestors in the same record by a 64-bit hash, reading an ancestor's uid only on a
/// hash match, and that uid is shared with every other member of the group, so it is usually
/// cached. Attribute values are read from the record too (no `BTreeMap` node to reach), and a
/// small set of entities, such as document_cloud's `blocked`, has the hashes of its entities
/// beside it, so `contains` usually answers without reaching the set. Cedar's entity is read
/// only for tags, and handed to Cedar's interpreter when a condition needs it.
#[derive(Debug)]
pub(crate) struct ClosedEntity {
    /// The entity's uid (equal to `entity.uid()`).
    uid: ast::EntityUID,
    /// Every ancestor, direct or not: each once when closed by [`Hierarchy::close_entity`]; as
    /// Cedar lists them (parents, then indirect ancestors) when made by [`ClosedEntity::of`].
    ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]>,
    /// The entity's attributes (the same values as Cedar's entity holds, sharing their sets and
    /// records), or `None` when one of them is not a concrete value.
    attrs: Option<SmallVec<[Attr; INLINE_ATTRS]>>,
    /// Cedar's entity, every ancestor among its parents (see [`Hierarchy::close_entity`]).
    entity: Arc<ast::Entity>,
}

impl ClosedEntity {
    /// A closed entity of `entity`, whose parents must already be all its ancestors, with
    /// `ancestors` (the same uids, each once, shared where possible).
    fn with_ancestors(
        entity: ast::Entity,
        ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]>,
    ) -> Self {
        debug_assert_eq!(entity.ancestors().count(), ancestors.len());
        let attrs = entity
            .attrs()
            .map(|(k, v)| match v {
                ast::PartialValue::Value(v) => Some(Attr::new(k.clone(), v.clone())),
                ast::PartialValue::Residual(_) => None,
            })
            .collect();
        Self {
            uid: entity.uid().clone(),
            ancestors,
            attrs,
            entity: Arc::new(entity),
        }
    }

    /// The closed entity of `entity`, taking the ancestors it holds (parents and indirect
    /// ancestors, as Cedar keeps them) as its whole closure: for an entity with no parents,
    /// such as a work item, or one Cedar has already closed.
    pub(crate) fn of(entity: ast::Entity) -> Self {
        let ancestors = entity
            .ancestors()
            .map(|a| (uid_hash(a), Arc::new(a.clone())))
            .collect();
        Self::with_ancestors(entity, ancestors)
    }

    /// The entity's uid.
    pub(crate) fn uid(&self) -> &ast::EntityUID {
        &self.uid
    }

    /// Cedar's entity, with every ancestor among its parents.
    pub(crate) fn entity(&self) -> &Arc<ast::Entity> {
        &self.entity
    }

    /// The attribute `name`: `Some(Ok((value, hashes)))`, `None` when the entity has no such
    /// attribute, or `Some(Err(value))` with Cedar's partial value when it is not a concrete
    /// value (never so for stored entities, which are parsed from JSON).
    ///
    /// `hashes`, when the value is a set of at most [`MAX_FILED_UIDS`] entities (and perhaps
    /// other values), holds the [`uid_hash`] of each of those entities, so a uid whose hash is
    /// not among them is not in the set. It is `None` for any other value, a bigger set, and
    /// every attribute of an entity with a residual one.
    pub(crate) fn attr_filed(&self, name: &str) -> Option<Result<Filed<'_>, &ast::PartialValue>> {
        match &self.attrs {
            Some(attrs) => attrs
                .iter()
                .find(|a| a.name == name)
                .map(|a| Ok((&a.value, a.uids.as_deref()))),
            None => self.entity.get(name).map(|pv| match pv {
                ast::PartialValue::Value(v) => Ok((v, None)),
                ast::PartialValue::Residual(_) => Err(pv),
            }),
        }
    }

    /// Every ancestor, direct or not, in no particular order (see the field's docs).
    pub(crate) fn ancestors(&self) -> impl Iterator<Item = &ast::EntityUID> {
        self.ancestors.iter().map(|(_, a)| &**a)
    }

    /// Whether `uid` is an ancestor (Cedar's `Entity::is_descendant_of`: the entity itself is
    /// not its own ancestor).
    pub(crate) fn is_descendant_of(&self, uid: &ast::EntityUID) -> bool {
        if self.ancestors.is_empty() {
            return false;
        }
        let h = uid_hash(uid);
        self.ancestors.iter().any(|(ah, a)| *ah == h && **a == *uid)
    }
}

/// The flat table of the closed entities of a [`Hierarchy`]: the records alone, each found by
/// its own uid, with no separate copy of the uid as a key.
///
/// A lookup of a principal that is not in the cache is the first step of most checks, and on a
/// store of 100,000 principals every memory load it makes misses. Cedar's `EntityUID` is 120
/// bytes, so a table keyed by it spans two cache lines per slot; a `hashbrown` table of record
/// pointers still reads its control bytes first and only then the slot they point at, two
/// dependent misses before the record. Here a slot holds the uid's 64-bit hash beside the
/// record pointer, and the slot is found from the hash alone (open addressing, linear
/// probing), so a lookup reads the slot's cache line and then the record, which confirms the
/// match by its uid and which the check reads anyway (callgrind's cache simulator: one miss
/// fewer per check than a `hashbrown` table). The table is built once from its entries and only
/// read after that ([`FlatTable`]), so it needs no removal and no growth.
#[derive(Debug, Default)]
pub(crate) struct EntityTable {
    /// A power of two of slots (or none), at most [`Self::MAX_LOAD`] of them full.
    slots: Box<[Slot]>,
    /// Full slots.
    len: usize,
}

/// One slot of an [`EntityTable`]: empty, or a record with the hash of its uid.
#[derive(Debug, Default)]
struct Slot {
    hash: u64,
    entity: Option<Arc<ClosedEntity>>,
}

impl EntityTable {
    /// Most full slots per slot, as a fraction (4/5): with linear probing a lookup of a
    /// present key reads about three slots on average at this load, within one or two lines.
    const MAX_LOAD: (usize, usize) = (4, 5);

    /// The slot where `uid` (whose hash is `h`) is, or the empty slot ending its probe
    /// sequence; `None` only for a table with no slots.
    fn probe<Q>(&self, h: u64, uid: &Q) -> Option<usize>
    where
        ast::EntityUID: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mask = self.slots.len().checked_sub(1)?;
        // The low bits place the slot (foldhash mixes every bit of its output).
        let mut i = (h as usize) & mask;
        loop {
            let slot = self.slots.get(i)?;
            match &slot.entity {
                None => return Some(i),
                Some(e) if slot.hash == h && e.uid().borrow() == uid => return Some(i),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }
}

impl EntityTable {
    /// Starts loading what a lookup of the uid whose [`uid_hash`] is `h` reads at `step`
    /// ([`Prefetch`]) and returns without waiting for it.
    fn prefetch(&self, h: u64, step: Prefetch) {
        match step {
            Prefetch::Slot => {
                let mask = self.slots.len().wrapping_sub(1);
                if let Some(slot) = self.slots.get((h as usize) & mask) {
                    prefetch_bytes(std::ptr::from_ref(slot).cast(), size_of::<Slot>());
                }
            }
            Prefetch::Record => {
                if let Some(e) = self.first_with_hash(h) {
                    // From the reference counts before the record (a check clones the `Arc`)
                    // to its end.
                    let counts = 2 * size_of::<usize>();
                    let start = Arc::as_ptr(e).cast::<u8>().wrapping_sub(counts);
                    prefetch_bytes(start, counts + size_of::<ClosedEntity>());
                }
            }
        }
    }

    /// The first record on the probe sequence of hash `h` whose uid has that hash: the record
    /// of the uid when it is present and no other uid shares its hash. Compares hashes only
    /// (a prefetch needs no more).
    fn first_with_hash(&self, h: u64) -> Option<&Arc<ClosedEntity>> {
        let mask = self.slots.len().checked_sub(1)?;
        let first = (h as usize) & mask;
        for i in (first..self.slots.len()).chain(0..first) {
            match self.slots.get(i)? {
                Slot {
                    hash,
                    entity: Some(e),
                } if *hash == h => return Some(e),
                Slot {
                    entity: Some(_), ..
                } => {}
                Slot { entity: None, .. } => return None,
            }
        }
        None
    }
}

/// How far [`crate::Prefetcher::prefetch`] gets the data of an entity lookup on its way into
/// the CPU's caches.
///
/// With 100,000 principals a principal's data is rarely cached, and a lookup is a chain of
/// dependent loads: the table slot (found from the uid's hash), then the record the slot points
/// at. Each load that misses waits for memory (about 0.1 us) while the CPU has little else to
/// do. A prefetch starts such a load early and returns at once, so the wait overlaps with work
/// done in between, such as reading the rest of the request (docs/benchmarks.md, "Decision
/// core").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    /// The table slot of the uid, found from its hash (the prefetch key): reads nothing.
    Slot,
    /// The record the slot points at (its uid, ancestors and attributes): reads the slot, so it
    /// pays off when [`Prefetch::Slot`] was asked for a little earlier.
    Record,
}

/// Asks the CPU to start loading every cache line of the `len` bytes at `p` into its caches,
/// and returns at once. Only a hint: nothing is read, and no address is ever dereferenced, so
/// any `p` is fine. On other architectures than x86-64 it does nothing.
#[inline]
fn prefetch_bytes(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        let skew = p as usize % LINE;
        let mut off = 0;
        while off < len + skew {
            // SAFETY: PREFETCHT0 (SSE, in every x86-64 CPU) is a hint: it never faults, whatever
            // the address, and writes no memory or register (Intel SDM vol. 2B, "PREFETCHh").
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_sub(skew).wrapping_add(off).cast()) };
            off += LINE;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

impl FlatTable<ast::EntityUID, Arc<ClosedEntity>> for EntityTable {
    /// The keys must be the entities' own uids; only the entities are kept.
    fn with_entries(entries: Vec<(ast::EntityUID, Arc<ClosedEntity>)>) -> Self {
        let (num, den) = Self::MAX_LOAD;
        let want = (entries.len() * den)
            .div_ceil(num)
            .max(1)
            .next_power_of_two();
        let mut table = Self {
            slots: std::iter::repeat_with(Slot::default).take(want).collect(),
            len: 0,
        };
        for (uid, e) in entries {
            debug_assert!(&uid == e.uid(), "an entity filed under another uid");
            let h = uid_hash(e.uid());
            // The table has more slots than entries, so the probe ends at a slot.
            if let Some(slot) = table.probe(h, e.uid()).and_then(|i| table.slots.get_mut(i)) {
                if slot.entity.is_none() {
                    table.len += 1;
                }
                *slot = Slot {
                    hash: h,
                    entity: Some(e),
                };
            }
        }
        table
    }

    fn get<Q>(&self, k: &Q) -> Option<&Arc<ClosedEntity>>
    where
        ast::EntityUID: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.len == 0 {
            return None;
        }
        // `uid_hash` of the uid `k` borrows from: the same hasher, and `Borrow` promises equal
        // hashes.
        let i = self.probe(UID_HASHER.hash_one(k), k)?;
        self.slots.get(i)?.entity.as_ref()
    }

    fn entries<'a>(&'a self) -> impl Iterator<Item = (&'a ast::EntityUID, &'a Arc<ClosedEntity>)>
    where
        ast::EntityUID: 'a,
        Arc<ClosedEntity>: 'a,
    {
        self.slots
            .iter()
            .filter_map(|s| s.entity.as_ref())
            .map(|e| (e.uid(), e))
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// A map read on every check and written incrementally (entities, their closures, risk
/// scores): a flat hash table (`base`, a [`FlatTable`] shared by snapshots through an `Arc`)
/// under a persistent map of the writes made since it was built (`overlay`, `None` marking a
/// removal).
///
/// A persistent map alone (a hash array mapped trie) costs a check one dependent memory load
/// per trie level; with 200,000 entities those loads miss the cache and a check grew by half
/// (`benches/bench_evaluate.py`, with imbl's map as the store). A lookup here costs one probe
/// of the overlay, which stays small and hot, and one probe of the flat table. Cloning is O(1);
/// a write costs an overlay insert, and [`Layered::settle`] (called once per published
/// snapshot) folds the overlay into a new base when it has grown past `max(1024, base / 16)`
/// entries.
#[derive(Debug)]
pub(crate) struct Layered<K: Hash + Eq + Clone, V: Clone, B: FlatTable<K, V> = FastMap<K, V>> {
    base: Arc<B>,
    overlay: PMap<K, Option<V>>,
    len: usize,
}

impl<K: Hash + Eq + Clone, V: Clone, B: FlatTable<K, V>> Clone for Layered<K, V, B> {
    /// O(1): the snapshot shares the flat table and the persistent overlay.
    fn clone(&self) -> Self {
        Self {
            base: Arc::clone(&self.base),
            overlay: self.overlay.clone(),
            len: self.len,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone, B: FlatTable<K, V>> Default for Layered<K, V, B> {
    fn default() -> Self {
        Self {
            base: Arc::new(B::default()),
            overlay: PMap::default(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone, B: FlatTable<K, V>> Layered<K, V, B> {
    /// The value of `k`, if present.
    pub(crate) fn get<Q>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.overlay.is_empty() {
            if let Some(v) = self.overlay.get(k) {
                return v.as_ref();
            }
        }
        self.base.get(k)
    }

    /// Whether `k` is present.
    pub(crate) fn contains_key<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    /// Inserts or replaces `k`; returns the previous value.
    pub(crate) fn insert(&mut self, k: K, v: V) -> Option<V> {
        let old = self.get(&k).cloned();
        if old.is_none() {
            self.len += 1;
        }
        self.overlay.insert(k, Some(v));
        old
    }

    /// Removes `k`; returns its value if it was present.
    pub(crate) fn remove<Q>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let old = self.get(k).cloned()?;
        self.len -= 1;
        if self.base.get(k).is_some() {
            self.overlay.insert(k.to_owned(), None);
        } else {
            self.overlay.remove(k);
        }
        Some(old)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the map is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let shadowed = !self.overlay.is_empty();
        self.base
            .entries()
            .filter(move |(k, _)| !shadowed || !self.overlay.contains_key(*k))
            .chain(
                self.overlay
                    .iter()
                    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v))),
            )
    }

    /// Every key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    /// Folds the overlay into a new flat base once it has grown past its share (see the type's
    /// documentation); snapshots that hold the old base keep it.
    pub(crate) fn settle(&mut self) {
        if self.overlay.len() <= OVERLAY_MIN.max(self.base.len() / OVERLAY_SHARE) {
            return;
        }
        let all: Vec<(K, V)> = self.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self.base = Arc::new(B::with_entries(all));
        self.overlay = PMap::default();
    }
}

impl<K: Hash + Eq + Clone, V: Clone, B: FlatTable<K, V>> FromIterator<(K, V)> for Layered<K, V, B> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let base = B::with_entries(iter.into_iter().collect());
        Self {
            len: base.len(),
            base: Arc::new(base),
            overlay: PMap::default(),
        }
    }
}

/// An entity with its direct parents and the entities its attributes reference, kept beside
/// the Cedar entity so a check can gather the slice it needs without scanning the store.
#[derive(Debug, Clone)]
pub struct StoredEntity {
    /// The Cedar entity.
    pub entity: Entity,
    /// Its parents (as written; Cedar computes the transitive closure per check).
    pub parents: Vec<EntityUid>,
    /// Entities referenced by its attributes, at any depth of sets and records, each with the
    /// name of the attribute it was found in.
    pub refs: Vec<(Arc<str>, EntityUid)>,
}

fn collect_refs(v: &EvalResult, out: &mut Vec<EntityUid>) {
    match v {
        EvalResult::EntityUid(u) => out.push(u.clone()),
        EvalResult::Set(s) => s.iter().for_each(|x| collect_refs(x, out)),
        EvalResult::Record(r) => r.iter().for_each(|(_, x)| collect_refs(x, out)),
        _ => {}
    }
}

impl StoredEntity {
    /// Wraps a Cedar entity, recording its parents and attribute references. Every uid in it
    /// is made canonical (`crate::intern`), so comparing it with others is cheap.
    pub fn from_entity(entity: Entity) -> Self {
        let entity = Entity::from(crate::intern::entity(entity.as_ref()));
        let mut refs = Vec::new();
        let mut found = Vec::new();
        for (name, v) in entity.attrs() {
            if let Ok(v) = v {
                collect_refs(&v, &mut found);
                if !found.is_empty() {
                    let name: Arc<str> = name.into();
                    refs.extend(found.drain(..).map(|u| (Arc::clone(&name), u)));
                }
            }
        }
        let (_, _, parents) = entity.clone().into_inner();
        Self {
            entity,
            parents: parents.into_iter().collect(),
            refs,
        }
    }

    /// Parses one entity in Cedar's JSON entity format (the HTTP inline-entity shape,
    /// docs/decisions.md#inline-entities:
    /// `uid`, `attrs` with `__entity` / `__extn` escapes, `parents`), typed by `schema` when the
    /// schema declares its type.
    ///
    /// # Errors
    /// [`RequestError`] on `field` when the JSON is not an entity or does not match the schema.
    pub fn from_json(
        value: Value,
        schema: Option<&Schema>,
        declared: &HashSet<String>,
        field: &str,
    ) -> Result<Self, RequestError> {
        let ty = value
            .get("uid")
            .and_then(|u| {
                u.get("type")
                    .or_else(|| u.get("__entity").and_then(|e| e.get("type")))
            })
            .and_then(Value::as_str)
            .map(str::to_owned);
        let schema = match (&ty, schema) {
            (Some(t), Some(s)) if declared.contains(t) => Some(s),
            _ => None,
        };
        let entity = Entity::from_json_value(value, schema)
            .map_err(|e| RequestError::new(field, chain(&e)))?;
        Ok(Self::from_entity(entity))
    }
}

/// A work item from the issue-tracker connector (the `svc_work_item_id` claim names one;
/// docs/decisions.md#work-items).
#[derive(Debug, Clone)]
pub struct WorkItem {
    /// Id in the connector's form, `<tracker>:<key>`.
    pub id: String,
    /// Whether the item is open; a closed item assigns nothing.
    pub open: bool,
    /// Resources the item links: an agent on this item counts as assigned to exactly these.
    pub links: HashSet<EntityUid>,
    /// The item as a Cedar entity (type `WorkItem` of the bundle's schema).
    pub entity: Arc<StoredEntity>,
    /// The same entity closed (a work item has no parents), made when the item was stored.
    pub(crate) closed: Arc<ClosedEntity>,
}

/// One immutable snapshot of everything the decision point knows besides the bundle.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub(crate) entities: Layered<EntityUid, Arc<StoredEntity>>,
    pub(crate) work_items: PMap<String, Arc<WorkItem>>,
    pub(crate) contained: PSet<EntityUid>,
    pub(crate) risk: Layered<EntityUid, i64>,
}

impl Store {
    /// Number of entities held (bundle entities not included).
    pub fn len(&self) -> usize {
        self.entities.len()
    }

    /// Whether the store holds no entity.
    pub fn is_empty(&self) -> bool {
        self.entities.is_empty()
    }

    /// Whether `uid` is contained.
    pub fn is_contained(&self, uid: &EntityUid) -> bool {
        self.contained.contains(uid)
    }

    /// The reasoner's risk score of `uid`, if it has one.
    pub fn risk(&self, uid: &EntityUid) -> Option<i64> {
        self.risk.get(uid).copied()
    }

    /// Folds the large maps' recent writes into their flat tables when due
    /// ([`Layered::settle`]); writers call it once before publishing a snapshot.
    pub(crate) fn settle(&mut self) {
        self.entities.settle();
        self.risk.settle();
    }
}

/// Parses a list of entity references (`{type, id}`, `Type::"id"` or `{"__entity": ...}`).
///
/// # Errors
/// [`RequestError`] on `field[i]` for the first bad reference.
pub fn parse_uid_list(value: &Value, field: &str) -> Result<Vec<EntityUid>, RequestError> {
    let arr = value
        .as_array()
        .ok_or_else(|| RequestError::new(field, "expected an array of entity references"))?;
    arr.iter()
        .enumerate()
        .map(|(i, v)| parse_uid(v, &format!("{field}[{i}]")))
        .collect()
}

/// Why [`Hierarchy::refresh`] refused a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unclosable {
    /// These entities would be their own ancestors.
    Cycles(Vec<EntityUid>),
    /// A parent chain would be longer than [`limits::max_entity_depth`].
    TooDeep(TooDeep),
}

/// Checks that no entity in `uids` starts a parent chain longer than
/// [`limits::max_entity_depth`], walking each link once ([`DepthCheck`]).
///
/// # Errors
/// [`TooDeep`] for the first entity over the limit.
pub(crate) fn check_depth<'a, 'u>(
    uids: impl Iterator<Item = &'u EntityUid>,
    look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
) -> Result<(), TooDeep> {
    let mut depth = DepthCheck::new(limits::max_entity_depth(), |u: &EntityUid| {
        look(u).map(|e| e.parents.as_slice())
    });
    for uid in uids {
        if let Some(se) = look(uid) {
            depth.depth(uid, &se.parents)?;
        }
    }
    Ok(())
}

/// Every entity the engine knows (the bundle's `entities.json` base layer, the store above it,
/// and the schema's action entities), each with its transitive ancestors precomputed.
///
/// Cedar needs the ancestor relation transitively closed before it evaluates. Computing the
/// closure of each check's slice was the largest cost of a check (see docs/benchmarks.md), so
/// the closure is kept here instead, per snapshot: a check hands Cedar `Arc`s of these entities
/// with [`TCComputation::AssumeAlreadyComputed`], copying nothing. Writers re-close only what a
/// change can reach: the changed entities, plus (when a changed entity is somebody's parent) every
/// entity whose ancestors include it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hierarchy {
    closed: Layered<ast::EntityUID, Arc<ClosedEntity>, EntityTable>,
    /// Uids that are (or were, since the last rebuild) an ancestor of some entity, each with
    /// the one copy of it every [`ClosedEntity`] below it shares. An entity outside this map
    /// has no descendants, so changing it re-closes only itself.
    parents: PMap<EntityUid, Arc<ast::EntityUID>>,
}

impl Hierarchy {
    /// Closes one entity: its Cedar entity with every ancestor reachable through `look`
    /// (depth-first, cycle-safe) added to its parents, and the same ancestors in the record
    /// checks read ([`ClosedEntity`]), each the copy shared through `self.parents`. The flag is
    /// true when the entity is its own ancestor (a cycle, which Cedar refuses).
    ///
    /// Every ancestor goes into the one set of parents, leaving Cedar's separate set of indirect
    /// ancestors empty. Cedar's `in` (`Entity::is_descendant_of`) and its ancestor iteration read
    /// both sets alike, so Cedar's interpreter decides the same; and a check probes one table
    /// where it probed two (fewer cache misses per check in callgrind's cache simulator). A
    /// closed entity is never written out, so the direct parents are not lost: the stored
    /// entity keeps them.
    fn close_entity<'a>(
        &mut self,
        se: &StoredEntity,
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> (ClosedEntity, bool) {
        let mut core: ast::Entity = se.entity.as_ref().clone();
        let mut seen: HashSet<EntityUid> = HashSet::new();
        let mut stack: Vec<&EntityUid> = se.parents.iter().collect();
        let own = se.entity.uid();
        let mut cyclic = false;
        let mut ancestors = SmallVec::new();
        while let Some(p) = stack.pop() {
            if !seen.insert(p.clone()) {
                continue;
            }
            if *p == own {
                cyclic = true;
                continue;
            }
            let shared = match self.parents.get(p) {
                Some(a) => Arc::clone(a),
                None => {
                    let a = Arc::new(p.as_ref().clone());
                    self.parents.insert(p.clone(), Arc::clone(&a));
                    a
                }
            };
            ancestors.push((uid_hash(&shared), shared));
            core.add_parent(p.as_ref().clone());
            if let Some(pe) = look(p) {
                stack.extend(pe.parents.iter().filter(|g| !seen.contains(*g)));
            }
        }
        (ClosedEntity::with_ancestors(core, ancestors), cyclic)
    }

    /// Closes every entity in `uids` from scratch. Returns the closure and the uids of entities
    /// that are their own ancestors (their cycle is left out of their closure).
    ///
    /// # Errors
    /// [`TooDeep`] for the first entity whose parent chain is longer than
    /// [`limits::max_entity_depth`], found before any closing is done (closing a chain of `d`
    /// levels costs `d * d / 2` entries).
    pub(crate) fn rebuild<'a, 'u>(
        uids: impl Iterator<Item = &'u EntityUid> + Clone,
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> Result<(Self, Vec<EntityUid>), TooDeep> {
        check_depth(uids.clone(), look)?;
        let mut h = Self::default();
        let mut cycles = Vec::new();
        let mut closed = Vec::new();
        for uid in uids {
            if let Some(se) = look(uid) {
                let (e, cyclic) = h.close_entity(se, look);
                if cyclic {
                    cycles.push(uid.clone());
                }
                closed.push((e.uid().clone(), Arc::new(e)));
            }
        }
        h.closed = closed.into_iter().collect();
        cycles.sort();
        Ok((h, cycles))
    }

    /// Re-closes after the entities `changed` were inserted, replaced or removed (`look` shows
    /// the state after the change).
    ///
    /// # Errors
    /// [`Unclosable::Cycles`] with the uids of entities the change made their own ancestors,
    /// and [`Unclosable::TooDeep`] when it made a parent chain longer than
    /// [`limits::max_entity_depth`] (checked before anything is closed); `self` is then half
    /// updated and must be dropped (writers work on a copy and do not publish it).
    pub(crate) fn refresh<'a>(
        &mut self,
        changed: &[EntityUid],
        look: &impl Fn(&EntityUid) -> Option<&'a StoredEntity>,
    ) -> Result<(), Unclosable> {
        let mut cycles = Vec::new();
        let mut affected: HashSet<EntityUid> = changed.iter().cloned().collect();
        if changed.iter().any(|u| self.parents.contains_key(u)) {
            let core: HashSet<&ast::EntityUID> = changed.iter().map(AsRef::as_ref).collect();
            for (uid, e) in self.closed.iter() {
                if e.ancestors().any(|a| core.contains(a)) {
                    affected.insert(EntityUid::from(uid.clone()));
                }
            }
        }
        check_depth(affected.iter(), look).map_err(Unclosable::TooDeep)?;
        for uid in affected {
            match look(&uid) {
                Some(se) => {
                    let (e, cyclic) = self.close_entity(se, look);
                    self.closed.insert(e.uid().clone(), Arc::new(e));
                    if cyclic {
                        cycles.push(uid);
                    }
                }
                None => {
                    self.closed.remove(uid.as_ref());
                }
            }
        }
        if cycles.is_empty() {
            Ok(())
        } else {
            cycles.sort();
            Err(Unclosable::Cycles(cycles))
        }
    }

    /// Folds recent writes into the flat table when due ([`Layered::settle`]).
    pub(crate) fn settle(&mut self) {
        self.closed.settle();
    }

    /// The closed entity `uid`, if known.
    pub(crate) fn get(&self, uid: &EntityUid) -> Option<&Arc<ClosedEntity>> {
        self.closed.get(uid.as_ref())
    }

    /// Starts loading what looking up the uid whose [`uid_hash`] is `key` reads at `step`,
    /// without waiting ([`Prefetch`]). Entities written since the flat table was last built
    /// are in a small map that stays cached, so only the flat table is prefetched.
    pub(crate) fn prefetch(&self, key: u64, step: Prefetch) {
        self.closed.base.prefetch(key, step);
    }

    /// The closed entity `uid` (Cedar's internal uid), if known.
    pub(crate) fn get_core(&self, uid: &ast::EntityUID) -> Option<&Arc<ClosedEntity>> {
        self.closed.get(uid)
    }

    /// Cedar `Entities` over already-closed entities (no copy, no closure computation).
    ///
    /// # Errors
    /// [`RequestError`] on `entities` if Cedar refuses the set (two different entities with one
    /// uid; callers deduplicate, so this is not expected).
    pub(crate) fn slice(
        entities: impl IntoIterator<Item = Arc<ast::Entity>>,
    ) -> Result<Entities, RequestError> {
        CoreEntities::new()
            .add_entities(
                entities,
                None::<&NoEntitiesSchema>,
                TCComputation::AssumeAlreadyComputed,
                Extensions::all_available(),
            )
            .map(Entities::from)
            .map_err(|e| RequestError::new("entities", chain(&e)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use std::str::FromStr;

    /// Cedar's entities of the JSON array `json`, their uids, the hierarchy closed over them
    /// and the uids [`Hierarchy::rebuild`] found on a cycle.
    fn closed_hierarchy(json: &str) -> (Entities, Vec<EntityUid>, Hierarchy, Vec<EntityUid>) {
        let cedar = Entities::from_json_str(json, None).unwrap();
        let stored: Vec<StoredEntity> = cedar
            .iter()
            .cloned()
            .map(StoredEntity::from_entity)
            .collect();
        let look = |u: &EntityUid| stored.iter().find(|s| s.entity.uid() == *u);
        let uids: Vec<EntityUid> = stored.iter().map(|s| s.entity.uid()).collect();
        let (h, cycles) = Hierarchy::rebuild(uids.iter(), &look).unwrap();
        (cedar, uids, h, cycles)
    }

    /// The flat table files every record under its [`uid_hash`], so a prefetch by that hash
    /// reaches the record a lookup then reads; prefetching (present, absent, on an empty
    /// table) changes no lookup.
    #[test]
    fn prefetch_reaches_the_record_a_lookup_reads() {
        let json: Vec<String> = (0..300)
            .map(|i| format!(r#"{{"uid": {{"type": "U", "id": "u{i}"}}, "attrs": {{}}, "parents": [{{"type": "G", "id": "g{}"}}]}}"#, i % 7))
            .collect();
        let (_, uids, h, _) = closed_hierarchy(&format!("[{}]", json.join(",")));
        let empty = Hierarchy::default();
        let absent = EntityUid::from_str(r#"U::"nobody""#).unwrap();
        for u in uids.iter().chain([&absent]) {
            let key = uid_hash(u.as_ref());
            for step in [Prefetch::Slot, Prefetch::Record] {
                h.prefetch(key, step);
                empty.prefetch(key, step);
            }
            let got = h.get(u);
            if u == &absent {
                assert!(got.is_none());
                continue;
            }
            let by_hash = h.closed.base.first_with_hash(key).unwrap();
            assert!(Arc::ptr_eq(by_hash, got.unwrap()), "{u}");
            assert!(empty.get(u).is_none());
        }
    }

    /// A hierarchy's closed records agree with Cedar's own transitive closure on `in` and on
    /// attributes, for entities with fewer and more ancestors and attributes than a record
    /// holds inline, and ancestors are shared between the records of one hierarchy.
    #[test]
    fn closed_records_match_cedar() {
        let json = r#"[
          {"uid": {"type": "U", "id": "a"}, "attrs": {"n": 1},
           "parents": [{"type": "G", "id": "g1"}, {"type": "G", "id": "g2"}]},
          {"uid": {"type": "U", "id": "b"}, "attrs": {"n": 2, "s": "x", "t": [1], "r": {"k": true},
           "m": [{"__entity": {"type": "G", "id": "g1"}}, 2, {"__entity": {"type": "U", "id": "a"}}]},
           "parents": [{"type": "G", "id": "g3"}, {"type": "G", "id": "g4"}, {"type": "G", "id": "g5"}]},
          {"uid": {"type": "G", "id": "g1"}, "attrs": {}, "parents": [{"type": "G", "id": "top"}]},
          {"uid": {"type": "G", "id": "g2"}, "attrs": {}, "parents": [{"type": "G", "id": "g1"}]},
          {"uid": {"type": "G", "id": "g3"}, "attrs": {}, "parents": [{"type": "G", "id": "top"}]},
          {"uid": {"type": "G", "id": "g4"}, "attrs": {}, "parents": []},
          {"uid": {"type": "G", "id": "g5"}, "attrs": {}, "parents": [{"type": "G", "id": "missing"}]},
          {"uid": {"type": "G", "id": "top"}, "attrs": {}, "parents": []}
        ]"#;
        // `a` also has a set of more entities than a record files by hash.
        let big: Vec<String> = (0..=MAX_FILED_UIDS)
            .map(|i| format!(r#"{{"__entity": {{"type": "G", "id": "x{i}"}}}}"#))
            .collect();
        let json = json.replace(
            r#""attrs": {"n": 1}"#,
            &format!(r#""attrs": {{"n": 1, "big": [{}]}}"#, big.join(", ")),
        );
        let (cedar, uids, h, cycles) = closed_hierarchy(&json);
        assert!(cycles.is_empty());
        let core: &CoreEntities = cedar.as_ref();
        let names = [
            "a", "b", "g1", "g2", "g3", "g4", "g5", "top", "missing", "zz",
        ];
        let every: Vec<ast::EntityUID> = names
            .iter()
            .flat_map(|n| ["U", "G"].map(|t| ast::EntityUID::with_eid_and_type(t, n).unwrap()))
            .collect();
        for u in &uids {
            let closed = h.get(u).unwrap();
            let cedar_policy_core::entities::Dereference::Data(want) = core.entity(u.as_ref())
            else {
                panic!("{u} not in Cedar's entities")
            };
            assert_eq!(closed.uid(), want.uid());
            for target in &every {
                assert_eq!(
                    closed.is_descendant_of(target),
                    want.is_descendant_of(target),
                    "{u} in {target}"
                );
            }
            for name in ["n", "s", "t", "r", "m", "big", "none"] {
                let filed = closed.attr_filed(name).map(|r| r.unwrap());
                if let Some((
                    ast::Value {
                        value: ast::ValueKind::Set(set),
                        ..
                    },
                    Some(hashes),
                )) = filed
                {
                    // Every entity in a filed set is found by its hash, and nothing else is.
                    for target in &every {
                        let v = ast::Value::from(target.clone());
                        if set.contains(&v) {
                            assert!(hashes.contains(&uid_hash(target)), "{u}.{name} {target}");
                        }
                    }
                    let entities = set.iter().filter(|v| {
                        matches!(v.value, ast::ValueKind::Lit(ast::Literal::EntityUID(_)))
                    });
                    assert_eq!(entities.count(), hashes.len());
                } else if let Some((v, Some(_))) = filed {
                    panic!("{u}.{name} = {v} has hashes but is not a set");
                }
                let got = filed.map(|(v, _)| v.clone());
                let want = want.get(name).map(|pv| match pv {
                    ast::PartialValue::Value(v) => v.clone(),
                    ast::PartialValue::Residual(_) => panic!("residual"),
                });
                assert_eq!(got, want, "{u}.{name}");
            }
        }
        // Which attributes have their entities filed by hash.
        let user = |u: &str| {
            h.get(&EntityUid::from_str(&format!("U::\"{u}\"")).unwrap())
                .unwrap()
        };
        let filed = |u: &str, name: &str| {
            user(u)
                .attr_filed(name)
                .unwrap()
                .unwrap()
                .1
                .map(<[u64]>::len)
        };
        assert_eq!(filed("b", "m"), Some(2));
        assert_eq!(filed("b", "t"), Some(0));
        assert_eq!(filed("b", "n"), None);
        assert_eq!(filed("a", "big"), None);
        // Both users reach `top`; their records share the one copy of its uid.
        let top = |u: &str| {
            let c = h
                .get(&EntityUid::from_str(&format!("U::\"{u}\"")).unwrap())
                .unwrap();
            let (_, shared) = c
                .ancestors
                .iter()
                .find(|(_, a)| a.eid().as_ref() == "top")
                .unwrap();
            Arc::clone(shared)
        };
        assert!(Arc::ptr_eq(&top("a"), &top("b")));
    }

    /// Compares a `Layered` map over an `EntityTable` against a `std` map of uid to entity over
    /// inserts, replacements, removals (of entities in the overlay only, in the table only, and
    /// absent ones) and settles, checking snapshots taken along the way too.
    #[test]
    fn closed_map_matches_a_plain_map() {
        let uid = |k: u32| ast::EntityUID::with_eid_and_type("User", &format!("u{k}")).unwrap();
        // An entity whose contents tell its version apart.
        let entity = |k: u32, v: u32| {
            let mut e = ast::Entity::with_uid(uid(k));
            e.add_parent(uid(100_000 + v));
            Arc::new(ClosedEntity::of(e))
        };
        type Closed = Layered<ast::EntityUID, Arc<ClosedEntity>, EntityTable>;
        let mut c: Closed = (0..3000).map(|k| (uid(k), entity(k, 0))).collect();
        let mut m: std::collections::HashMap<ast::EntityUID, Arc<ClosedEntity>> =
            (0..3000).map(|k| (uid(k), entity(k, 0))).collect();
        let same = |c: &Closed, m: &std::collections::HashMap<_, Arc<ClosedEntity>>| {
            assert_eq!(c.len(), m.len());
            assert_eq!(c.iter().count(), m.len());
            for k in 0..5000 {
                let got = c
                    .get(&uid(k))
                    .map(|e| e.entity().deep_eq(m.get(&uid(k)).unwrap().entity()));
                assert_eq!(got.is_some(), m.contains_key(&uid(k)), "u{k}");
                assert_ne!(got, Some(false), "u{k}");
            }
        };
        let mut snapshots = Vec::new();
        for step in 0u32..20_000 {
            let k = step.wrapping_mul(2_654_435_761) % 5000;
            if step % 3 == 0 {
                c.remove(&uid(k));
                m.remove(&uid(k));
            } else {
                c.insert(uid(k), entity(k, step));
                m.insert(uid(k), entity(k, step));
            }
            if step % 997 == 0 {
                snapshots.push((c.clone(), m.clone()));
                c.settle();
            }
        }
        same(&c, &m);
        for (c, m) in &snapshots {
            same(c, m);
        }
    }

    /// Compares a `Layered` map against a `std` map over inserts, replacements, removals and
    /// settles, including removals of keys that live only in the overlay or only in the base.
    #[test]
    fn layered_map_matches_a_plain_map() {
        let mut l: Layered<u32, u32> = (0..3000).map(|k| (k, k)).collect();
        let mut m: std::collections::HashMap<u32, u32> = (0..3000).map(|k| (k, k)).collect();
        let mut snapshots = Vec::new();
        for step in 0u32..20_000 {
            let k = step.wrapping_mul(2_654_435_761) % 5000;
            if step % 3 == 0 {
                assert_eq!(l.remove(&k), m.remove(&k));
            } else {
                assert_eq!(l.insert(k, step), m.insert(k, step));
            }
            if step % 997 == 0 {
                snapshots.push((l.clone(), m.clone()));
                l.settle();
            }
            assert_eq!(l.len(), m.len());
        }
        for (l, m) in snapshots
            .iter()
            .chain(std::iter::once(&(l.clone(), m.clone())))
        {
            let mut got: Vec<(u32, u32)> = l.iter().map(|(k, v)| (*k, *v)).collect();
            got.sort_unstable();
            let mut want: Vec<(u32, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            want.sort_unstable();
            assert_eq!(got, want);
            for k in 0..5000 {
                assert_eq!(l.get(&k), m.get(&k));
            }
        }
    }
}
