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
use crate::request::{check_identifier, parse_uid};
use cedar_policy::{Entities, Entity, EntityUid, EvalResult, Schema};
use cedar_policy_core::ast;
use cedar_policy_core::entities::{Entities as CoreEntities, NoEntitiesSchema, TCComputation};
use cedar_policy_core::extensions::Extensions;
use ref_cast::RefCast;
use serde_json::Value;
use smallvec::SmallVec;
use smol_str::SmolStr;
use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, LazyLock, OnceLock};

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

/// One uid shared by every record that holds it: the one copy of a group every member's
/// ancestors point at, or of a manager every report's `manager` attribute points at.
pub(crate) type Interner = FastMap<ast::EntityUID, Arc<ast::EntityUID>>;

/// The shared copy of `uid` in `interner`, made on first use.
fn interned(interner: &mut Interner, uid: &ast::EntityUID) -> Arc<ast::EntityUID> {
    if let Some(a) = interner.get(uid) {
        return Arc::clone(a);
    }
    let a = Arc::new(uid.clone());
    interner.insert(uid.clone(), Arc::clone(&a));
    a
}

/// `v` with an entity uid at its top level replaced by the shared copy in `interner` (Cedar
/// parses each `{"__entity": ...}` into an allocation of its own: 136 bytes per `manager`).
fn share_value(v: &ast::Value, interner: &mut Interner) -> ast::Value {
    match &v.value {
        ast::ValueKind::Lit(ast::Literal::EntityUID(u)) => ast::Value::new(
            ast::Literal::EntityUID(interned(interner, u)),
            v.loc.clone(),
        ),
        _ => v.clone(),
    }
}

/// One attribute of a [`ClosedEntity`]: its name and value and, for a set of entities, their
/// hashes.
#[derive(Debug, Clone)]
pub(crate) struct Attr {
    name: SmolStr,
    /// The attribute's value (sharing Cedar's set or record).
    value: ast::Value,
    /// For a set holding at most [`MAX_FILED_UIDS`] entity uids, the [`uid_hash`] of each, in
    /// the record itself for a set of one (the usual `blocked` or `owners`): a uid whose hash
    /// is not among them is not in the set, which answers the usual
    /// `principal.blocked.contains(resource.owner)` without reaching Cedar's hash set behind
    /// the value (its header, then its control bytes: two dependent cache misses on a
    /// principal not in the cache). Empty for any other value; for a bigger set, which is not
    /// filed, empty with room for more ([`Attr::filed`] tells the two apart without another
    /// field, which would cost every attribute eight bytes).
    uids: SmallVec<[u64; 1]>,
}

impl Attr {
    /// The attribute `name` with `value`, its entities' hashes filed when it is a set of at
    /// most [`MAX_FILED_UIDS`] of them.
    fn new(name: SmolStr, value: ast::Value) -> Self {
        let uids = match &value.value {
            ast::ValueKind::Set(s) => {
                let uids: SmallVec<[u64; 1]> = s
                    .authoritative
                    .iter()
                    .filter_map(|v| match &v.value {
                        ast::ValueKind::Lit(ast::Literal::EntityUID(u)) => Some(uid_hash(u)),
                        _ => None,
                    })
                    .take(MAX_FILED_UIDS + 1)
                    .collect();
                if uids.len() <= MAX_FILED_UIDS {
                    let mut uids = uids;
                    uids.shrink_to_fit();
                    uids
                } else {
                    // Not filed: empty, on the heap (see the field's docs).
                    SmallVec::with_capacity(2)
                }
            }
            _ => SmallVec::new(),
        };
        Self { name, value, uids }
    }

    /// The hashes of the entities in the value when it is a set that is filed (see
    /// [`Attr::uids`]), else `None`.
    fn filed(&self) -> Option<&[u64]> {
        match &self.value.value {
            ast::ValueKind::Set(_) if !(self.uids.spilled() && self.uids.is_empty()) => {
                Some(&self.uids)
            }
            _ => None,
        }
    }
}

/// What few entities have: attributes Cedar keeps as partial values (never those of an entity
/// parsed from JSON) and tags (RFC 82).
#[derive(Debug, Clone, Default)]
struct Rare {
    /// Every attribute, when one of them is not a concrete value (the record's own list is
    /// then empty).
    partial: Option<Box<[(SmolStr, ast::PartialValue)]>>,
    /// The entity's tags.
    tags: Box<[(SmolStr, ast::PartialValue)]>,
}

/// An entity as the snapshot keeps it: its uid, its direct parents and every other ancestor
/// (the transitive closure), and its attribute values and tags, in one small record; the
/// entity as written (what the store was sent) and as Cedar's interpreter reads it are both
/// made from it (docs/decisions.md, "What the store keeps per entity").
///
/// This is the only copy of a stored entity: the store's table and the hierarchy's table point
/// at the same record. Cedar's `Entity` (a `BTreeMap` node of attributes, about 1.7 KB, and a
/// hash set of 120-byte uids) is made only when a check leaves a condition to Cedar's
/// interpreter or a plan reads the entity, and then kept in the record for the snapshot's life
/// ([`ClosedEntity::entity`]).
///
/// Looking a principal up and asking `principal in G` are what every check does, and with
/// 100,000 principals the principal's data is rarely in the cache. In Cedar's `Entity` they
/// were a chain of dependent loads: the entity (five cache lines, its uid first), then its
/// ancestor set's control bytes, then the 120-byte uid in the matching bucket (callgrind's
/// cache simulator). Here the table compares the record's own uid, and `in` scans at most a
/// few ancestors in the same record by a 64-bit hash, reading an ancestor's uid only on a
/// hash match, and that uid is shared with every other member of the group, so it is usually
/// cached. Attribute values are read from the record's list (no `BTreeMap` node to reach), and
/// a small set of entities, such as document_cloud's `blocked`, has the hashes of its entities
/// beside it, so `contains` usually answers without reaching the set.
#[derive(Debug)]
pub(crate) struct Record<A: ?Sized> {
    /// The entity's uid.
    uid: ast::EntityUID,
    /// Every ancestor, each once: first the direct parents (`direct` of them, as written, the
    /// entity itself left out), then the indirect ancestors.
    ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]>,
    /// How many of `ancestors` are direct parents.
    direct: u32,
    /// Whether the entity lists itself among its parents (a cycle; kept so that the entity
    /// as written and Cedar's closed entity are what they were).
    self_parent: bool,
    /// Partial attributes and tags, for the few entities that have them.
    rare: Option<Box<Rare>>,
    /// Cedar's entity with every ancestor among its parents, made on first use.
    cedar: OnceLock<Arc<ast::Entity>>,
    /// The attributes past [`MAX_INLINE_ATTRS`], when there are more (then all of them are
    /// here, in name order, and `attrs` is empty).
    more: Box<[Attr]>,
    /// The attributes, in name order, in the record's own allocation (empty when `rare` holds
    /// them as partial values or `more` holds them).
    attrs: A,
}

/// A record with its attributes in its own allocation: [`Record`] over a slice, so that the
/// record is one allocation of the size its attributes need (made by [`Record::boxed`]).
pub(crate) type ClosedEntity = Record<[Attr]>;

/// Most attributes [`Record::boxed`] places in the record's own allocation; an entity with
/// more keeps them in a separate one.
const MAX_INLINE_ATTRS: usize = 8;

impl Record<()> {
    /// The record made of `self`'s fields and `attrs`, in one allocation sized for them:
    /// `Arc<Record<[Attr; N]>>` unsized to `Arc<ClosedEntity>` (a safe coercion), `N` chosen
    /// at run time among 0..=[`MAX_INLINE_ATTRS`]; more attributes go to `more`.
    fn boxed(self, attrs: Vec<Attr>) -> Arc<ClosedEntity> {
        let Record {
            uid,
            ancestors,
            direct,
            self_parent,
            rare,
            cedar,
            ..
        } = self;
        macro_rules! sized {
            ($attrs:expr, $($n:literal)*) => {
                match $attrs.len() {
                    $($n => match <[Attr; $n]>::try_from($attrs) {
                        Ok(a) => {
                            let r: Arc<ClosedEntity> = Arc::new(Record {
                                uid, ancestors, direct, self_parent, rare, cedar,
                                more: Box::default(),
                                attrs: a,
                            });
                            return r;
                        }
                        Err(v) => v,
                    },)*
                    _ => $attrs,
                }
            };
        }
        let more = if attrs.len() <= MAX_INLINE_ATTRS {
            sized!(attrs, 0 1 2 3 4 5 6 7 8)
        } else {
            attrs
        };
        Arc::new(Record {
            uid,
            ancestors,
            direct,
            self_parent,
            rare,
            cedar,
            more: more.into_boxed_slice(),
            attrs: [],
        })
    }
}

/// The parents of an entity as written, from a [`StoredEntity`] or a [`ClosedEntity`].
#[derive(Clone)]
pub(crate) enum Parents<'a> {
    /// A stored entity's list.
    Uids(std::slice::Iter<'a, EntityUid>),
    /// The direct parents at the head of a record's ancestors.
    Shared(std::slice::Iter<'a, Ancestor>),
}

impl<'a> Iterator for Parents<'a> {
    type Item = &'a EntityUid;

    fn next(&mut self) -> Option<&'a EntityUid> {
        match self {
            Self::Uids(i) => i.next(),
            Self::Shared(i) => i.next().map(|(_, a)| EntityUid::ref_cast(&**a)),
        }
    }
}

impl ClosedEntity {
    /// A record of `uid` with `ancestors` (the first `direct` of them its direct parents),
    /// `self_parent`, and the attributes and tags of `attrs_of` (Cedar's entity, whose uids in
    /// attribute values are shared through `interner`).
    fn build(
        uid: ast::EntityUID,
        ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]>,
        direct: usize,
        self_parent: bool,
        attrs_of: &ast::Entity,
        interner: &mut Interner,
    ) -> Arc<Self> {
        let mut rare = Rare::default();
        let concrete = attrs_of
            .attrs()
            .all(|(_, v)| matches!(v, ast::PartialValue::Value(_)));
        let attrs: Vec<Attr> = if concrete {
            attrs_of
                .attrs()
                .filter_map(|(k, v)| match v {
                    ast::PartialValue::Value(v) => {
                        Some(Attr::new(k.clone(), share_value(v, interner)))
                    }
                    ast::PartialValue::Residual(_) => None,
                })
                .collect()
        } else {
            rare.partial = Some(
                attrs_of
                    .attrs()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            Vec::new()
        };
        rare.tags = attrs_of
            .tags()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let rare = (rare.partial.is_some() || !rare.tags.is_empty()).then(|| Box::new(rare));
        Record {
            uid,
            ancestors,
            direct: u32::try_from(direct).unwrap_or(u32::MAX),
            self_parent,
            rare,
            cedar: OnceLock::new(),
            more: Box::default(),
            attrs: (),
        }
        .boxed(attrs)
    }

    /// The record of `entity` as written, not closed: its ancestors are its parents (each the
    /// copy in `interner`), and Cedar's indirect ancestors if it lists any. What a write stores
    /// before [`Hierarchy`] closes it.
    pub(crate) fn written(entity: &ast::Entity, interner: &mut Interner) -> Arc<Self> {
        let own = entity.uid();
        let mut ancestors = SmallVec::new();
        let mut self_parent = false;
        for p in entity.parents() {
            if p == own {
                self_parent = true;
            } else {
                ancestors.push((uid_hash(p), interned(interner, p)));
            }
        }
        let direct = ancestors.len();
        for a in entity.indirect_ancestors() {
            if a != own && !entity.is_child_of(a) {
                ancestors.push((uid_hash(a), interned(interner, a)));
            }
        }
        Self::build(
            own.clone(),
            ancestors,
            direct,
            self_parent,
            entity,
            interner,
        )
    }

    /// The closed entity of `entity`, taking the ancestors it holds (parents and indirect
    /// ancestors, as Cedar keeps them) as its whole closure: for an entity with no parents,
    /// such as a work item, or one Cedar has already closed.
    pub(crate) fn of(entity: ast::Entity) -> Arc<Self> {
        Self::written(&entity, &mut Interner::default())
    }

    /// A copy of this record with other `ancestors` (the first `direct` of them its direct
    /// parents): the same uid, attributes and tags.
    fn reclosed(
        &self,
        ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]>,
        direct: usize,
    ) -> Arc<Self> {
        Record {
            uid: self.uid.clone(),
            ancestors,
            direct: u32::try_from(direct).unwrap_or(u32::MAX),
            self_parent: self.self_parent,
            rare: self.rare.clone(),
            cedar: OnceLock::new(),
            more: Box::default(),
            attrs: (),
        }
        .boxed(self.attr_list().to_vec())
    }

    /// The attributes, in name order (empty when they are partial values, see `rare`).
    fn attr_list(&self) -> &[Attr] {
        if self.more.is_empty() {
            &self.attrs
        } else {
            &self.more
        }
    }

    /// The entity's uid.
    pub(crate) fn uid(&self) -> &ast::EntityUID {
        &self.uid
    }

    /// The direct parents, as written (the entity itself left out; see
    /// [`ClosedEntity::self_parent`]).
    fn direct(&self) -> &[Ancestor] {
        let n = usize::try_from(self.direct).unwrap_or(usize::MAX);
        self.ancestors.get(..n).unwrap_or(&self.ancestors)
    }

    /// Every attribute with its value, in name order; partial values as Cedar keeps them.
    fn attr_values(&self) -> impl Iterator<Item = (SmolStr, ast::PartialValue)> + '_ {
        let partial = self
            .rare
            .as_ref()
            .and_then(|r| r.partial.as_deref())
            .unwrap_or_default();
        self.attr_list()
            .iter()
            .map(|a| (a.name.clone(), ast::PartialValue::Value(a.value.clone())))
            .chain(partial.iter().cloned())
    }

    /// The tags with their values.
    fn tag_values(&self) -> impl Iterator<Item = (SmolStr, ast::PartialValue)> + '_ {
        self.rare
            .as_ref()
            .map(|r| &*r.tags)
            .unwrap_or_default()
            .iter()
            .cloned()
    }

    /// Cedar's entity with `parents` and no indirect ancestors.
    fn to_cedar(&self, parents: HashSet<ast::EntityUID>) -> ast::Entity {
        ast::Entity::new_with_attr_partial_value(
            self.uid.clone(),
            self.attr_values(),
            HashSet::new(),
            parents,
            self.tag_values(),
        )
    }

    /// Cedar's entity, with every ancestor among its parents (and the entity itself when it
    /// lists itself as a parent): made on the first call and kept in the record, so the same
    /// record always gives the same `Arc` (the plan memos compare them by address).
    pub(crate) fn entity(&self) -> &Arc<ast::Entity> {
        self.cedar.get_or_init(|| {
            let mut parents: HashSet<ast::EntityUID> =
                self.ancestors.iter().map(|(_, a)| (**a).clone()).collect();
            if self.self_parent {
                parents.insert(self.uid.clone());
            }
            Arc::new(self.to_cedar(parents))
        })
    }

    /// The entity as it was written (direct parents only, which Cedar closes itself): what a
    /// check with inline entities hands Cedar.
    pub(crate) fn written_entity(&self) -> Entity {
        let mut parents: HashSet<ast::EntityUID> =
            self.direct().iter().map(|(_, a)| (**a).clone()).collect();
        if self.self_parent {
            parents.insert(self.uid.clone());
        }
        Entity::from(self.to_cedar(parents))
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
        if let Some(a) = self.attr_list().iter().find(|a| a.name == name) {
            return Some(Ok((&a.value, a.filed())));
        }
        let partial = self.rare.as_ref()?.partial.as_deref()?;
        partial
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, pv)| match pv {
                ast::PartialValue::Value(v) => Ok((v, None)),
                ast::PartialValue::Residual(_) => Err(pv),
            })
    }

    /// The tag `tag` (Cedar's `Entity::get_tag`).
    pub(crate) fn tag(&self, tag: &str) -> Option<&ast::PartialValue> {
        self.rare
            .as_ref()?
            .tags
            .iter()
            .find(|(k, _)| k == tag)
            .map(|(_, v)| v)
    }

    /// Calls `f` with every entity uid in the attributes `take` accepts (by name), at any depth
    /// of sets and records, in attribute-name order (partial values left out).
    pub(crate) fn for_each_ref<'s>(
        &'s self,
        mut take: impl FnMut(&'s str) -> bool,
        mut f: impl FnMut(&'s ast::EntityUID),
    ) {
        fn walk<'v>(v: &'v ast::Value, f: &mut impl FnMut(&'v ast::EntityUID)) {
            match &v.value {
                ast::ValueKind::Lit(ast::Literal::EntityUID(u)) => f(u),
                ast::ValueKind::Set(s) => s.authoritative.iter().for_each(|x| walk(x, f)),
                ast::ValueKind::Record(r) => r.values().for_each(|x| walk(x, f)),
                ast::ValueKind::Lit(_) | ast::ValueKind::ExtensionValue(_) => {}
            }
        }
        for a in self.attr_list() {
            if take(&a.name) {
                walk(&a.value, &mut f);
            }
        }
        if let Some(partial) = self.rare.as_ref().and_then(|r| r.partial.as_deref()) {
            for (k, pv) in partial {
                if let ast::PartialValue::Value(v) = pv {
                    if take(k) {
                        walk(v, &mut f);
                    }
                }
            }
        }
    }

    /// Every entity uid in the attributes ([`ClosedEntity::for_each_ref`]), with the name of
    /// the attribute it was found in.
    pub(crate) fn refs(&self) -> Vec<(&str, &ast::EntityUID)> {
        let mut out = Vec::new();
        let name = std::cell::Cell::new("");
        self.for_each_ref(
            |n| {
                name.set(n);
                true
            },
            |u| out.push((name.get(), u)),
        );
        out
    }

    /// Every ancestor, direct or not, direct parents first.
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

/// An entity as written (its uid, direct parents, attributes and references): a stored
/// entity's record, or a bundle's, an action's or an inline [`StoredEntity`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Written<'a> {
    /// A bundle, action, inline or work-item entity.
    Stored(&'a StoredEntity),
    /// A stored entity's record.
    Record(&'a ClosedEntity),
}

impl<'a> Written<'a> {
    /// The entity's uid.
    pub(crate) fn uid(self) -> &'a ast::EntityUID {
        match self {
            Self::Stored(s) => s.entity.as_ref().uid(),
            Self::Record(r) => r.uid(),
        }
    }

    /// The direct parents as written.
    pub(crate) fn parents(self) -> Parents<'a> {
        match self {
            Self::Stored(s) => Parents::Uids(s.parents.iter()),
            Self::Record(r) => {
                // The entity itself, when it is its own parent, is not among the record's
                // ancestors; Cedar's walks skip it anyway.
                Parents::Shared(r.direct().iter())
            }
        }
    }

    /// Whether the entity lists itself among its parents.
    pub(crate) fn self_parent(self) -> bool {
        match self {
            Self::Stored(s) => s
                .parents
                .iter()
                .any(|p| p.as_ref() == s.entity.as_ref().uid()),
            Self::Record(r) => r.self_parent,
        }
    }

    /// Cedar's entity as written (direct parents only).
    pub(crate) fn to_entity(self) -> Entity {
        match self {
            Self::Stored(s) => s.entity.clone(),
            Self::Record(r) => r.written_entity(),
        }
    }

    /// The entities its attributes reference, each with the attribute's name.
    pub(crate) fn refs(self) -> Vec<(&'a str, &'a ast::EntityUID)> {
        match self {
            Self::Stored(s) => s.refs.iter().map(|(k, u)| (&**k, u.as_ref())).collect(),
            Self::Record(r) => r.refs(),
        }
    }

    /// The attribute `name`, when it is a concrete value.
    pub(crate) fn attr(self, name: &str) -> Option<&'a ast::Value> {
        match self {
            Self::Stored(s) => match s.entity.as_ref().get(name)? {
                ast::PartialValue::Value(v) => Some(v),
                ast::PartialValue::Residual(_) => None,
            },
            Self::Record(r) => r.attr_filed(name)?.ok().map(|(v, _)| v),
        }
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
                    prefetch_bytes(start, counts + size_of_val(&**e));
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
/// the Cedar entity so a check can gather the slice it needs without scanning the store: the
/// form of the bundle's, the action, inline and work-item entities. Stored entities are parsed
/// into it and kept only as records ([`ClosedEntity`]).
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

    /// Refuses an entity whose id, or a parent's id, holds a control character
    /// ([`check_identifier`](crate::request::check_identifier)): what a check's inline entities
    /// and every entity write are held to.
    ///
    /// # Errors
    /// [`RequestError`] on `<field>.uid.id` or `<field>.parents[j].id`.
    pub(crate) fn check_ids(&self, field: &str) -> Result<(), RequestError> {
        let id = self.entity.uid();
        check_identifier(id.id().unescaped(), &format!("{field}.uid.id"))?;
        for (j, p) in self.parents.iter().enumerate() {
            check_identifier(p.id().unescaped(), &format!("{field}.parents[{j}].id"))?;
        }
        Ok(())
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
    /// The stored entities' records, each the very record the hierarchy holds for its uid.
    pub(crate) entities: Layered<ast::EntityUID, Arc<ClosedEntity>, EntityTable>,
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

/// Checks that no entity in `uids` starts a parent chain longer than
/// [`limits::max_entity_depth`], walking each link once ([`DepthCheck`]).
///
/// # Errors
/// [`TooDeep`] for the first entity over the limit.
pub(crate) fn check_depth<'a, 'u>(
    uids: impl Iterator<Item = &'u EntityUid>,
    look: &impl Fn(&EntityUid) -> Option<Written<'a>>,
) -> Result<(), TooDeep> {
    let mut depth = DepthCheck::new(limits::max_entity_depth(), |u: &EntityUid| {
        look(u).map(Written::parents)
    });
    for uid in uids {
        if let Some(w) = look(uid) {
            depth.depth(uid, w.parents())?;
        }
    }
    Ok(())
}

/// Every entity the engine knows (the bundle's `entities.json` base layer, the store above it,
/// and the schema's action entities), each with its transitive ancestors precomputed.
///
/// Cedar needs the ancestor relation transitively closed before it evaluates. Computing the
/// closure of each check's slice was the largest cost of a check (see docs/benchmarks.md), so
/// the closure is kept here instead, per snapshot, in one record per entity ([`ClosedEntity`],
/// shared with the store's table): compiled conditions read the records, and a check that
/// leaves a condition to Cedar hands it the Cedar entities made from them
/// ([`ClosedEntity::entity`]) with [`TCComputation::AssumeAlreadyComputed`]. Writers re-close only what a
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
    /// The copy of ancestor `p` every record shares, made and filed on first use.
    fn share(&mut self, p: &EntityUid) -> Ancestor {
        let shared = match self.parents.get(p) {
            Some(a) => Arc::clone(a),
            None => {
                let a = Arc::new(p.as_ref().clone());
                self.parents.insert(p.clone(), Arc::clone(&a));
                a
            }
        };
        (uid_hash(&shared), shared)
    }

    /// Closes one entity (`w`, as written): its record with every ancestor reachable through
    /// `look` (direct parents first, then depth-first, cycle-safe), each the copy shared
    /// through `self.parents`. The flag is true when the entity is its own ancestor (a cycle,
    /// which Cedar refuses).
    ///
    /// Cedar's entity made from the record ([`ClosedEntity::entity`]) has every ancestor in its
    /// one set of parents, leaving Cedar's separate set of indirect ancestors empty. Cedar's
    /// `in` (`Entity::is_descendant_of`) and its ancestor iteration read both sets alike, so
    /// Cedar's interpreter decides the same; the record keeps which ancestors are direct
    /// parents, so the entity as written is not lost.
    fn close_entity<'a>(
        &mut self,
        w: Written<'_>,
        look: &impl Fn(&EntityUid) -> Option<Written<'a>>,
    ) -> (Arc<ClosedEntity>, bool) {
        let own = w.uid();
        let mut seen: HashSet<&EntityUid> = HashSet::new();
        let mut ancestors: SmallVec<[Ancestor; INLINE_ANCESTORS]> = SmallVec::new();
        let mut cyclic = w.self_parent();
        let mut stack: Vec<&EntityUid> = Vec::new();
        for p in w.parents() {
            if p.as_ref() == own {
                cyclic = true;
                continue;
            }
            if !seen.insert(p) {
                continue;
            }
            ancestors.push(self.share(p));
            if let Some(pw) = look(p) {
                stack.extend(pw.parents());
            }
        }
        let direct = ancestors.len();
        while let Some(p) = stack.pop() {
            if p.as_ref() == own {
                cyclic = true;
                continue;
            }
            if !seen.insert(p) {
                continue;
            }
            ancestors.push(self.share(p));
            if let Some(pw) = look(p) {
                stack.extend(pw.parents().filter(|g| !seen.contains(*g)));
            }
        }
        let closed = match w {
            Written::Record(r) => r.reclosed(ancestors, direct),
            Written::Stored(s) => ClosedEntity::build(
                own.clone(),
                ancestors,
                direct,
                w.self_parent(),
                s.entity.as_ref(),
                &mut Interner::default(),
            ),
        };
        (closed, cyclic)
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
        look: &impl Fn(&EntityUid) -> Option<Written<'a>>,
    ) -> Result<(Self, Vec<EntityUid>), TooDeep> {
        check_depth(uids.clone(), look)?;
        let mut h = Self::default();
        let mut cycles = Vec::new();
        let mut closed = Vec::new();
        for uid in uids {
            if let Some(w) = look(uid) {
                let (e, cyclic) = h.close_entity(w, look);
                if cyclic {
                    cycles.push(uid.clone());
                }
                closed.push((e.uid().clone(), e));
            }
        }
        h.closed = closed.into_iter().collect();
        cycles.sort();
        Ok((h, cycles))
    }

    /// Re-closes after the entities `changed` were inserted, replaced or removed (`look` shows
    /// the state after the change). Returns every uid it re-closed or removed, and the uids of
    /// entities the change made their own ancestors (sorted; a writer refuses the change when
    /// there are any).
    ///
    /// # Errors
    /// [`TooDeep`] when the change made a parent chain longer than
    /// [`limits::max_entity_depth`] (checked before anything is closed).
    pub(crate) fn refresh<'a>(
        &mut self,
        changed: &[EntityUid],
        look: &impl Fn(&EntityUid) -> Option<Written<'a>>,
    ) -> Result<(Vec<EntityUid>, Vec<EntityUid>), TooDeep> {
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
        check_depth(affected.iter(), look)?;
        let mut done = Vec::with_capacity(affected.len());
        for uid in affected {
            match look(&uid) {
                Some(w) => {
                    let (e, cyclic) = self.close_entity(w, look);
                    self.closed.insert(e.uid().clone(), e);
                    if cyclic {
                        cycles.push(uid.clone());
                    }
                }
                None => {
                    self.closed.remove(uid.as_ref());
                }
            }
            done.push(uid);
        }
        cycles.sort();
        Ok((done, cycles))
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
        let look = |u: &EntityUid| {
            stored
                .iter()
                .find(|s| s.entity.uid() == *u)
                .map(Written::Stored)
        };
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
            ClosedEntity::of(e)
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
