//! The hash maps and sets of the decision core, named once so every module means the same
//! hasher and the same map kind.
//!
//! * [`FastHasher`]: foldhash, seeded at random per process. Entity uids are hashed several
//!   times per check, and SipHash (the standard hasher) was about a tenth of a check
//!   (docs/benchmarks.md, "Decision core").
//! * [`FastMap`] / [`FastSet`]: the standard hash map and set with [`FastHasher`].
//! * [`PMap`] / [`PSet`]: persistent (structurally shared) maps and sets from `imbl`, the
//!   writes a store snapshot makes over its shared base (crate::store, `Layered`).
//! * [`Inline`]: a check's inline entities by uid.

use cedar_policy::EntityUid;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The hasher of svc's own maps: foldhash, seeded at random per process.
pub(crate) type FastHasher = foldhash::fast::RandomState;
/// A persistent hash map with [`FastHasher`].
pub(crate) type PMap<K, V> =
    imbl::GenericHashMap<K, V, FastHasher, imbl::shared_ptr::DefaultSharedPtr>;
/// A persistent hash set with [`FastHasher`].
pub(crate) type PSet<K> = imbl::GenericHashSet<K, FastHasher, imbl::shared_ptr::DefaultSharedPtr>;
/// A hash map with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, FastHasher>;
/// A hash set with [`FastHasher`].
pub(crate) type FastSet<K> = HashSet<K, FastHasher>;
/// A check's inline entities that are taken, by uid (`E`: the stored entity type,
/// crate::store's `StoredEntity`; generic so that this module depends on no other).
pub(crate) type Inline<E> = HashMap<EntityUid, Arc<E>>;
