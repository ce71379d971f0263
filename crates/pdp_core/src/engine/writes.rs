//! The engine's writes: bundle swaps and template links, entity upserts and snapshots,
//! service-account registrations, work items, containments and risk scores
//! (docs/architecture.md#what-the-decision-point-keeps-in-memory). Each is all or nothing, made
//! on a copy of the state and published with one swap ([`Engine::update`]); each moves the
//! version counter of what it changed.

use super::snapshot::{cycle, Caches, State};
use super::state::Engine;
use crate::bundle::{Bundle, TemplateLink};
use crate::decision::Mode;
use crate::error::{chain, BundleError, RequestError, SourceError};
use crate::request::{kind, parse_uid};
use crate::store::{parse_uid_list, ClosedEntity, Interner, StoredEntity, WorkItem};
use cedar_policy::{Entity, EntityTypeName, EntityUid};
use cedar_policy_core::ast;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// What an engine-wide store update changed, used to move the right version counter.
#[derive(Default)]
struct Touched {
    principals: bool,
    resources: bool,
}

impl Engine {
    /// Replaces the bundle atomically; `policy_version` moves.
    ///
    /// # Errors
    /// [`BundleError`] on `entities.json` when the bundle's entities and the stored ones
    /// together form a parent chain longer than [`limits::max_entity_depth`]; the bundle in
    /// force is unchanged.
    pub fn replace_bundle(&self, bundle: Bundle) -> Result<(), BundleError> {
        self.update(|s| {
            s.caches = Arc::new(Caches::new(&bundle));
            s.bundle = Arc::new(bundle);
            s.policy_version += 1;
            // Keeps serving: a new bundle that closes a cycle with stored entities leaves that
            // cycle out of the closure rather than refusing the bundle.
            s.rebuild_hierarchy()
                .map(drop)
                .map_err(|e| BundleError::one(SourceError::file("entities.json", e.to_string())))
        })
    }

    /// Links templates into the bundle in force (all or nothing); `policy_version` moves.
    ///
    /// # Errors
    /// [`BundleError`] naming each bad link; the bundle in force is unchanged.
    pub fn link_templates(&self, links: &[TemplateLink]) -> Result<(), BundleError> {
        self.update(|s| {
            let next = s.bundle.with_links(links)?;
            s.caches = Arc::new(s.caches.relinked(&next));
            s.bundle = Arc::new(next);
            s.policy_version += 1;
            Ok(())
        })
    }

    /// Sets the mode reported with decisions.
    pub fn set_mode(&self, mode: Mode) {
        let _ = self.update::<(), ()>(|s| {
            s.mode = mode;
            Ok(())
        });
    }

    /// Parses `values` into records as written ([`ClosedEntity::written`]), each with its uid;
    /// each Cedar entity is dropped as soon as its record is made, so a large snapshot never
    /// holds Cedar's form of every entity at once.
    fn parse_entities(
        bundle: &Bundle,
        values: Vec<Value>,
        field: &str,
    ) -> Result<Vec<(EntityUid, Arc<ClosedEntity>)>, RequestError> {
        let mut seen = HashSet::new();
        let mut interner = Interner::default();
        let mut out = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            let f = format!("{field}[{i}]");
            let se = StoredEntity::from_json(v, bundle.schema(), &bundle.entity_types, &f)?;
            let uid = se.entity.uid();
            bundle.check_type(uid.type_name(), &format!("{f}.uid.type"))?;
            se.check_ids(&f)?;
            if !seen.insert(uid.clone()) {
                return Err(RequestError::new(f, format!("duplicate entity `{uid}`")));
            }
            let record = ClosedEntity::written(se.entity.as_ref(), &mut interner);
            out.push((uid, record));
        }
        Ok(out)
    }

    fn touch(s: &mut State, t: &Touched) {
        if t.principals {
            s.principals_version += 1;
        }
        if t.resources {
            s.resources_version += 1;
        }
    }

    /// Inserts or replaces entities (Cedar JSON entity shape), all or nothing.
    ///
    /// # Errors
    /// [`RequestError`] on `entities[i]` for the first entity that is malformed, of a type the
    /// schema does not declare, does not match the schema, or repeats a uid; nothing is stored.
    pub fn upsert_entities(&self, values: Vec<Value>) -> Result<usize, RequestError> {
        self.update(|s| {
            let parsed = Self::parse_entities(&s.bundle, values, "entities")?;
            let n = parsed.len();
            let mut t = Touched::default();
            let mut changed = Vec::with_capacity(n);
            for (uid, record) in parsed {
                if s.bundle.is_principal_type(uid.type_name()) {
                    t.principals = true;
                } else {
                    t.resources = true;
                }
                s.store.entities.insert(uid.as_ref().clone(), record);
                changed.push(uid);
            }
            s.refresh_hierarchy(&changed, "entities")?;
            Self::touch(s, &t);
            Ok(n)
        })
    }

    /// Replaces every stored entity with `values` in one atomic swap (a principals/resources
    /// snapshot). Work items, containments and risk scores are kept.
    ///
    /// # Errors
    /// As [`Engine::upsert_entities`]; the previous snapshot stays in force.
    pub fn replace_entities(&self, values: Vec<Value>) -> Result<usize, RequestError> {
        self.update(|s| {
            let parsed = Self::parse_entities(&s.bundle, values, "entities")?;
            let n = parsed.len();
            s.store.entities = parsed
                .into_iter()
                .map(|(uid, record)| (AsRef::<ast::EntityUID>::as_ref(&uid).clone(), record))
                .collect();
            let cycles = s
                .rebuild_hierarchy()
                .map_err(|e| RequestError::new("entities", e.to_string()))?;
            if !cycles.is_empty() {
                return Err(cycle("entities", &cycles));
            }
            Self::touch(
                s,
                &Touched {
                    principals: true,
                    resources: true,
                },
            );
            Ok(n)
        })
    }

    /// Removes entities by uid; returns how many were present.
    ///
    /// # Errors
    /// [`RequestError`] on `uids[i]` for a malformed reference; nothing is removed.
    pub fn remove_entities(&self, uids: &Value) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "uids")?;
        self.update(|s| {
            let mut t = Touched::default();
            let mut n = 0;
            let mut changed = Vec::new();
            for u in &uids {
                if s.store.entities.remove(u.as_ref()).is_some() {
                    changed.push(u.clone());
                    n += 1;
                    if s.bundle.is_principal_type(u.type_name()) {
                        t.principals = true;
                    } else {
                        t.resources = true;
                    }
                }
            }
            s.refresh_hierarchy(&changed, "uids")?;
            Self::touch(s, &t);
            Ok(n)
        })
    }

    /// Registers (or re-registers) service accounts from their records
    /// (docs/architecture.md#entities-and-the-base-schema):
    /// `{id, owner, ai, groups, description, app?}`. Each becomes a `ServiceAccount` entity with
    /// attributes `owner` (a `Human`), `ai`, `registered = true`, `app` (default: the id up to its
    /// first dot), `description`, and the named `Group`s as parents.
    ///
    /// # Errors
    /// [`RequestError`] on `service_accounts[i].<field>`; nothing is registered.
    pub fn register_service_accounts(&self, records: &Value) -> Result<usize, RequestError> {
        let arr = records.as_array().ok_or_else(|| {
            RequestError::new(
                "service_accounts",
                "expected an array of service-account records",
            )
        })?;
        self.update(|s| {
            let b = &s.bundle;
            let sa_ty = b.type_named("ServiceAccount");
            let human_ty = b.type_named("Human");
            let group_ty = b.type_named("Group");
            let (Some(sa_ty), Some(human_ty), Some(group_ty)) = (sa_ty, human_ty, group_ty) else {
                return Err(RequestError::new("service_accounts", "invalid built-in type names"));
            };
            let mut out = Vec::with_capacity(arr.len());
            for (i, r) in arr.iter().enumerate() {
                let f = |k: &str| format!("service_accounts[{i}].{k}");
                let obj = r.as_object().ok_or_else(|| {
                    RequestError::new(format!("service_accounts[{i}]"), "expected an object")
                })?;
                for k in obj.keys() {
                    if !["id", "owner", "ai", "groups", "description", "app"].contains(&k.as_str())
                    {
                        return Err(RequestError::new(f(k), format!("unknown field `{k}`")));
                    }
                }
                let id = obj
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("id"), "expected a non-empty string"))?;
                let owner = obj
                    .get("owner")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("owner"), "expected a user name"))?;
                let ai = match obj.get("ai") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(o) => {
                        return Err(RequestError::new(f("ai"), format!("expected a boolean, got {}", kind(o))))
                    }
                };
                let groups: Vec<&str> = match obj.get("groups") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(gs)) => gs
                        .iter()
                        .map(|g| {
                            g.as_str().ok_or_else(|| {
                                RequestError::new(f("groups"), "expected an array of group names")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(RequestError::new(f("groups"), "expected an array of group names"))
                    }
                };
                let description = match obj.get("description") {
                    None | Some(Value::Null) => "",
                    Some(Value::String(d)) => d.as_str(),
                    Some(o) => {
                        return Err(RequestError::new(f("description"), format!("expected a string, got {}", kind(o))))
                    }
                };
                let app = match obj.get("app") {
                    Some(Value::String(a)) => a.clone(),
                    None | Some(Value::Null) => id.split('.').next().unwrap_or(id).to_owned(),
                    Some(o) => {
                        return Err(RequestError::new(f("app"), format!("expected a string, got {}", kind(o))))
                    }
                };
                let entity = json!({
                    "uid": {"type": sa_ty.to_string(), "id": id},
                    "attrs": {
                        "owner": {"__entity": {"type": human_ty.to_string(), "id": owner}},
                        "ai": ai,
                        "registered": true,
                        "app": app,
                        "description": description,
                    },
                    "parents": groups.iter().map(|g| json!({"type": group_ty.to_string(), "id": g})).collect::<Vec<_>>(),
                });
                let e = Entity::from_json_value(entity, None)
                    .map_err(|e| RequestError::new(format!("service_accounts[{i}]"), chain(&e)))?;
                out.push(StoredEntity::from_entity(e));
            }
            let n = out.len();
            let mut changed = Vec::with_capacity(n);
            let mut interner = Interner::default();
            for se in out {
                let uid = se.entity.uid();
                let record = ClosedEntity::written(se.entity.as_ref(), &mut interner);
                s.store.entities.insert(uid.as_ref().clone(), record);
                changed.push(uid);
            }
            s.refresh_hierarchy(&changed, "service_accounts")?;
            s.principals_version += 1;
            Ok(n)
        })
    }

    /// Retires service accounts by id: they are removed from the store, so every later check
    /// they make is denied with `svc:unregistered` (docs/architecture.md#built-in-denials).
    /// Returns how many were present.
    pub fn unregister_service_accounts(&self, ids: &[String]) -> usize {
        self.update::<usize, ()>(|s| {
            let Some(sa_ty) = s.bundle.type_named("ServiceAccount") else {
                return Ok(0);
            };
            let mut n = 0;
            let mut changed = Vec::new();
            for id in ids {
                let uid = EntityUid::from_type_name_and_id(
                    sa_ty.clone(),
                    cedar_policy::EntityId::new(id),
                );
                if s.store.entities.remove(uid.as_ref()).is_some() {
                    changed.push(uid);
                    n += 1;
                }
            }
            // Removing an entity cannot close a cycle.
            let _ = s.refresh_hierarchy(&changed, "ids");
            s.principals_version += 1;
            Ok(n)
        })
        .unwrap_or(0)
    }

    /// Inserts or replaces work items: `{id, status: "open"|"closed", links: [uid], attrs?}`.
    ///
    /// # Errors
    /// [`RequestError`] on `work_items[i].<field>`; nothing is stored.
    pub fn upsert_work_items(&self, items: &Value) -> Result<usize, RequestError> {
        let arr = items
            .as_array()
            .ok_or_else(|| RequestError::new("work_items", "expected an array of work items"))?;
        self.update(|s| {
            let Some(wi_ty) = s.bundle.type_named("WorkItem") else {
                return Err(RequestError::new("work_items", "invalid built-in type name"));
            };
            let mut out = Vec::with_capacity(arr.len());
            for (i, r) in arr.iter().enumerate() {
                let f = |k: &str| format!("work_items[{i}].{k}");
                let obj = r.as_object().ok_or_else(|| {
                    RequestError::new(format!("work_items[{i}]"), "expected an object")
                })?;
                for k in obj.keys() {
                    if !["id", "status", "links", "attrs"].contains(&k.as_str()) {
                        return Err(RequestError::new(f(k), format!("unknown field `{k}`")));
                    }
                }
                let id = obj
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| RequestError::new(f("id"), "expected a non-empty string"))?;
                let open = match obj.get("status").and_then(Value::as_str) {
                    Some("open") | None => true,
                    Some("closed") => false,
                    Some(o) => {
                        return Err(RequestError::new(
                            f("status"),
                            format!("unknown status `{o}`: expected `open` or `closed`"),
                        ))
                    }
                };
                let links: HashSet<EntityUid> = match obj.get("links") {
                    None => HashSet::new(),
                    Some(l) => parse_uid_list(l, &f("links"))?.into_iter().collect(),
                };
                let attrs = obj.get("attrs").cloned().unwrap_or_else(|| json!({}));
                if !attrs.is_object() {
                    return Err(RequestError::new(f("attrs"), "expected an object"));
                }
                let entity = Entity::from_json_value(
                    json!({"uid": {"type": wi_ty.to_string(), "id": id}, "attrs": attrs, "parents": []}),
                    None,
                )
                .map_err(|e| RequestError::new(f("attrs"), chain(&e)))?;
                // A work item has no parents, so it is its own closure.
                let se = StoredEntity::from_entity(entity);
                let closed = ClosedEntity::of(se.entity.as_ref().clone());
                out.push(WorkItem {
                    id: id.to_owned(),
                    open,
                    links,
                    entity: Arc::new(se),
                    closed,
                });
            }
            let n = out.len();
            for w in out {
                s.store.work_items.insert(w.id.clone(), Arc::new(w));
            }
            s.resources_version += 1;
            Ok(n)
        })
    }

    /// Removes work items by id; returns how many were present.
    pub fn remove_work_items(&self, ids: &[String]) -> usize {
        self.update::<usize, ()>(|s| {
            let n = ids
                .iter()
                .filter(|id| s.store.work_items.remove(id.as_str()).is_some())
                .count();
            s.resources_version += 1;
            Ok(n)
        })
        .unwrap_or(0)
    }

    /// Replaces the containment list (the containment feed's snapshot).
    ///
    /// # Errors
    /// [`RequestError`] on `contained[i]` for a malformed reference; the list is unchanged.
    pub fn set_containments(&self, uids: &Value) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "contained")?;
        self.update(|s| {
            s.store.contained = uids.into_iter().collect();
            s.principals_version += 1;
            Ok(s.store.contained.len())
        })
    }

    /// Contains (`contained = true`) or lifts (`false`) principals (the feed's deltas).
    ///
    /// # Errors
    /// [`RequestError`] on `principals[i]` for a malformed reference; nothing changes.
    pub fn set_contained(&self, uids: &Value, contained: bool) -> Result<usize, RequestError> {
        let uids = parse_uid_list(uids, "principals")?;
        self.update(|s| {
            for u in uids {
                if contained {
                    s.store.contained.insert(u);
                } else {
                    s.store.contained.remove(&u);
                }
            }
            s.principals_version += 1;
            Ok(s.store.contained.len())
        })
    }

    /// Sets reasoner risk scores: `[{principal: uid, score: 0..=100}]`. With `replace`, scores
    /// not listed are dropped.
    ///
    /// # Errors
    /// [`RequestError`] on `scores[i].<field>` for a malformed entry or a score outside 0..=100.
    pub fn set_risk_scores(&self, scores: &Value, replace: bool) -> Result<usize, RequestError> {
        let arr = scores.as_array().ok_or_else(|| {
            RequestError::new("scores", "expected an array of {principal, score}")
        })?;
        let mut parsed = Vec::with_capacity(arr.len());
        for (i, e) in arr.iter().enumerate() {
            let p = parse_uid(
                e.get("principal").unwrap_or(&Value::Null),
                &format!("scores[{i}].principal"),
            )?;
            let score = e
                .get("score")
                .and_then(Value::as_i64)
                .filter(|s| (0..=100).contains(s))
                .ok_or_else(|| {
                    RequestError::new(format!("scores[{i}].score"), "expected an integer 0..=100")
                })?;
            parsed.push((p, score));
        }
        self.update(|s| {
            if replace {
                s.store.risk = crate::store::Layered::default();
            }
            for (p, score) in parsed {
                s.store.risk.insert(p, score);
            }
            s.principals_version += 1;
            Ok(s.store.risk.len())
        })
    }
}

impl Engine {
    /// Which of a check's resource and work item the engine lacks and a resource source could
    /// supply (docs/context.md#the-decision-point-following-it): of `resources`, those whose
    /// type the bundle declares (any, without a schema), is not a directory type (`Human`,
    /// `Group`, `ServiceAccount`: the principals snapshot brings those) and which neither the
    /// store nor the bundle holds; of `work_items`, those the store does not hold. Reads one
    /// snapshot; returns the two lists in the order given (empty when nothing is missing).
    #[must_use]
    pub fn missing(
        &self,
        resources: &[&EntityUid],
        work_items: &[&str],
    ) -> (Vec<EntityUid>, Vec<String>) {
        let st = self.state.load();
        let b = &*st.bundle;
        let res = resources
            .iter()
            .filter(|u| {
                let ty = u.type_name();
                !b.is_directory_type(ty)
                    && b.check_type(ty, "resource.type").is_ok()
                    && st.entity(u).is_none()
            })
            .map(|u| (*u).clone())
            .collect();
        let items = work_items
            .iter()
            .filter(|id| !st.store.work_items.contains_key(**id))
            .map(|id| (*id).to_owned())
            .collect();
        (res, items)
    }

    /// The resource type named `name` (as requests name types: `Document`, or qualified)
    /// when a resource source could serve it, as in [`Engine::missing`]: declared by the
    /// bundle (any, without a schema) and not a directory type. `None` otherwise.
    #[must_use]
    pub fn source_type(&self, name: &str) -> Option<EntityTypeName> {
        let st = self.state.load();
        let b = &*st.bundle;
        let ty = b.resolve_type(name, "resource.type").ok()?;
        (!b.is_directory_type(&ty) && b.check_type(&ty, "resource.type").is_ok()).then_some(ty)
    }
}
