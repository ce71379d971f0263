//! Limits on what one request or one load may make the decision core do (docs/decisions.md,
//! "Limits").
//!
//! Every walk over entity parents in the core is iterative, but Cedar's own transitive-closure
//! computation (run on the slice of a check that carries inline entities) recurses once per
//! level of a parent chain, and closing a chain of `d` levels costs `d * d / 2` ancestor
//! entries. So hierarchies are bounded in depth wherever they enter: inline entities of a check,
//! entity-store writes and a bundle's `entities.json`. Inline entities are also bounded in
//! number. A request or load over a limit is refused with an error that names the limit and
//! its value.
//!
//! The limits are process-wide settings (atomics), set once at start from the decision point's
//! settings ([`set_max_entity_depth`], [`set_max_inline_entities`]); they default to
//! [`DEFAULT_MAX_ENTITY_DEPTH`] and [`DEFAULT_MAX_INLINE_ENTITIES`].

use cedar_policy::EntityUid;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Default of [`max_entity_depth`]: parent links from an entity to its farthest ancestor.
/// Directories nest groups a handful of levels deep; 64 leaves room for deep folder trees
/// while keeping a chain's closure (64 * 64 / 2 entries) and Cedar's recursion small.
pub const DEFAULT_MAX_ENTITY_DEPTH: usize = 64;

/// Default of [`max_inline_entities`]: inline entities one check may carry.
pub const DEFAULT_MAX_INLINE_ENTITIES: usize = 1_000;

static MAX_ENTITY_DEPTH: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_ENTITY_DEPTH);
static MAX_INLINE_ENTITIES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_INLINE_ENTITIES);

/// The longest parent chain (in links) any entity may have, inline, stored or in a bundle.
pub fn max_entity_depth() -> usize {
    MAX_ENTITY_DEPTH.load(Ordering::Relaxed)
}

/// Sets [`max_entity_depth`] for the whole process (at least 1; 0 is taken as 1). Applies to
/// loads and checks from then on; entities already stored are not re-checked.
pub fn set_max_entity_depth(n: usize) {
    MAX_ENTITY_DEPTH.store(n.max(1), Ordering::Relaxed);
}

/// The most inline entities (`entities` of an HTTP check, AuthZEN `properties`) one check may
/// carry.
pub fn max_inline_entities() -> usize {
    MAX_INLINE_ENTITIES.load(Ordering::Relaxed)
}

/// Sets [`max_inline_entities`] for the whole process (0 refuses every inline entity).
pub fn set_max_inline_entities(n: usize) {
    MAX_INLINE_ENTITIES.store(n, Ordering::Relaxed);
}

/// An entity whose parent chain is longer than the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the parents of `{uid}` form a chain more than {limit} levels deep (limit `max_entity_depth` = {limit})"
)]
pub struct TooDeep {
    /// The entity the over-long chain starts from, as Cedar writes it (`Type::"id"`).
    pub uid: String,
    /// The limit it exceeds ([`max_entity_depth`] when the check ran).
    pub limit: usize,
}

/// Measures parent chains without recursion, remembering each entity's depth so that checking
/// many entities over one graph walks each link once (`O(entities + links)` in all).
///
/// `parents` gives an entity's direct parents (an iterator `I`, such as a slice's), or `None`
/// for an entity the graph does not hold (it counts as having none). A cycle is not this check's business (the closure reports
/// cycles): a link back into the chain being walked is skipped.
pub struct DepthCheck<'a, F> {
    parents: F,
    limit: usize,
    memo: HashMap<&'a EntityUid, usize>,
}

impl<'a, F, I> DepthCheck<'a, F>
where
    F: Fn(&EntityUid) -> Option<I>,
    I: Iterator<Item = &'a EntityUid>,
{
    /// A check against `limit` links over the graph `parents` describes.
    pub fn new(limit: usize, parents: F) -> Self {
        Self {
            parents,
            limit,
            memo: HashMap::new(),
        }
    }

    /// The depth (links to the farthest ancestor) of an entity whose direct parents are
    /// `first`, checked against the limit.
    ///
    /// # Errors
    /// [`TooDeep`] naming `uid` when some chain above it is longer than the limit.
    pub fn depth(&mut self, uid: &EntityUid, first: I) -> Result<usize, TooDeep> {
        let limit = self.limit;
        let too_deep = || TooDeep {
            uid: uid.to_string(),
            limit,
        };
        // The walk's path: each entity on it with the parents left to visit and the deepest
        // chain found above it so far. The path is never longer than limit + 1 entries.
        let mut path: Vec<(Option<&'a EntityUid>, Option<I>, usize)> = vec![(None, Some(first), 0)];
        let mut result = 0;
        while let Some(top) = path.last_mut() {
            let next = top.1.as_mut().and_then(Iterator::next);
            let Some(p) = next else {
                let (done, _, d) = path.pop().unwrap_or((None, None, 0));
                match (done, path.last_mut()) {
                    (Some(u), Some(below)) => {
                        self.memo.insert(u, d);
                        below.2 = below.2.max(d + 1);
                    }
                    (_, None) => result = d,
                    (None, Some(_)) => {}
                }
                continue;
            };
            if p == uid || path.iter().any(|(u, _, _)| *u == Some(p)) {
                continue; // a cycle: reported by the closure, not here
            }
            let d = match self.memo.get(p) {
                Some(&d) => d,
                None => {
                    if path.len() > self.limit {
                        return Err(too_deep());
                    }
                    path.push((Some(p), (self.parents)(p), 0));
                    continue;
                }
            };
            if let Some(top) = path.last_mut() {
                top.2 = top.2.max(d + 1);
            }
        }
        if result > self.limit {
            return Err(too_deep());
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use std::str::FromStr;

    fn uid(i: usize) -> EntityUid {
        EntityUid::from_str(&format!("Group::\"g{i}\"")).unwrap()
    }

    /// A graph as a map from uid to its parents.
    fn graph(edges: &[(usize, &[usize])]) -> HashMap<EntityUid, Vec<EntityUid>> {
        edges
            .iter()
            .map(|(u, ps)| (uid(*u), ps.iter().map(|p| uid(*p)).collect()))
            .collect()
    }

    fn depth_of(
        g: &HashMap<EntityUid, Vec<EntityUid>>,
        u: usize,
        limit: usize,
    ) -> Result<usize, TooDeep> {
        let mut c = DepthCheck::new(limit, |x: &EntityUid| g.get(x).map(|v| v.iter()));
        let first = g.get(&uid(u)).map_or(&[][..], Vec::as_slice);
        c.depth(&uid(u), first.iter())
    }

    #[test]
    fn chains_diamonds_and_cycles() {
        // 0 -> 1 -> 2 -> 3, and 0 -> 3 directly: the longest chain counts.
        let g = graph(&[(0, &[1, 3]), (1, &[2]), (2, &[3]), (3, &[])]);
        assert_eq!(depth_of(&g, 0, 10), Ok(3));
        assert_eq!(depth_of(&g, 3, 10), Ok(0));
        assert_eq!(depth_of(&g, 0, 3), Ok(3));
        assert_eq!(depth_of(&g, 0, 2).unwrap_err().limit, 2);
        // A parent the graph does not hold has no parents of its own.
        let g = graph(&[(0, &[9])]);
        assert_eq!(depth_of(&g, 0, 1), Ok(1));
        // A cycle ends the walk instead of looping.
        let g = graph(&[(0, &[1]), (1, &[2]), (2, &[0])]);
        assert_eq!(depth_of(&g, 0, 10), Ok(2));
    }

    #[test]
    fn a_chain_far_past_the_limit_stops_at_the_limit() {
        let n = 200_000;
        let g: HashMap<EntityUid, Vec<EntityUid>> =
            (0..n).map(|i| (uid(i), vec![uid(i + 1)])).collect();
        let err = depth_of(&g, 0, 64).unwrap_err();
        assert_eq!(
            err,
            TooDeep {
                uid: uid(0).to_string(),
                limit: 64
            }
        );
        assert!(err.to_string().contains("max_entity_depth"));
        assert_eq!(depth_of(&g, n - 64, 64), Ok(64));
    }

    #[test]
    fn one_check_walks_shared_ancestors_once() {
        // Many entities under one long chain: the memo answers for the chain after the first.
        let mut g: HashMap<EntityUid, Vec<EntityUid>> =
            (0..60).map(|i| (uid(i), vec![uid(i + 1)])).collect();
        for i in 1000..1100 {
            g.insert(uid(i), vec![uid(0)]);
        }
        let mut c = DepthCheck::new(64, |x: &EntityUid| g.get(x).map(|v| v.iter()));
        for i in 1000..1100 {
            let first = g.get(&uid(i)).map_or(&[][..], Vec::as_slice);
            assert_eq!(c.depth(&uid(i), first.iter()), Ok(61));
        }
    }
}
