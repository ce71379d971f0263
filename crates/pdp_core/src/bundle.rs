//! Policy bundles: a policy set, a schema, base entities and template links, validated together.
//!
//! A bundle is built from texts in memory, [`BundleSources`] (docs/bundles.md):
//!
//! * one or more policy files, numbered in the order given;
//! * at most one schema, in Cedar syntax or JSON syntax;
//! * optionally entities: Cedar's entity JSON (an array), or an entity map keyed by UID
//!   (the format of Cedar's TinyTodo example);
//! * optionally template links in the Cedar CLI's format.
//!
//! This crate reads no files: `pdp_server::bundle_dir` reads a bundle directory into
//! [`BundleSources`]. Policies are validated strictly against the schema and every problem is
//! reported with file, line and column (docs/bundles.md#validation).
//!
//! A policy's name is its `@id("...")` annotation, else the id Cedar assigns while parsing:
//! `policy0`, `policy1`, ... counted over all files as if they were one text in the order given
//! (file-name order for a bundle directory).
//! `@challenge("verification" | "approval" | "justification")` marks a step-up policy
//! (docs/bundles.md#step-up-policies).

use crate::error::{chain, BundleError, RequestError, SourceError};
use crate::lookups::Lookups;
use crate::maps::FastMap;
use crate::store::StoredEntity;
use cedar_policy::{
    Effect, Entity, EntityId, EntityTypeName, EntityUid, Policy, PolicyId, PolicySet, Schema,
    SchemaFragment, SlotId, Template, ValidationMode, Validator,
};
use miette::Diagnostic;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

/// Step-up kinds a `@challenge` annotation may name (docs/bundles.md#step-up-policies).
pub const CHALLENGE_KINDS: [&str; 3] = ["verification", "approval", "justification"];

/// The texts a bundle is built from: `(file name, contents)` pairs.
#[derive(Debug, Clone, Default)]
pub struct BundleSources {
    /// Policy files, in the order their policies are numbered.
    pub policies: Vec<(String, String)>,
    /// The schema file, if any. Syntax is taken from the name (`.json` = JSON) or, for
    /// pseudo-names, from the text (a leading `{` = JSON).
    pub schema: Option<(String, String)>,
    /// The entities file, if any.
    pub entities: Option<(String, String)>,
    /// The template-links file, if any.
    pub links: Option<(String, String)>,
}

/// What the decision core knows about one policy (static or template-linked).
#[derive(Debug, Clone)]
pub struct PolicyMeta {
    /// The policy's name (`@id` or Cedar's id); equal to its `PolicyId` in the bundle.
    pub name: String,
    /// `permit` or `forbid`.
    pub effect: Effect,
    /// Step-up kinds from `@challenge`, empty for a plain policy.
    pub challenges: Vec<String>,
    /// File the policy (or its template) came from.
    pub file: String,
}

/// One template link, as in the Cedar CLI's template-linked file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateLink {
    /// Name of the template to link.
    pub template_id: String,
    /// Name of the new linked policy.
    pub link_id: String,
    /// Slot values, keyed `?principal` / `?resource`.
    pub args: BTreeMap<String, EntityUid>,
}

impl TemplateLink {
    /// Parses the Cedar CLI's template-linked format: a JSON array of
    /// `{"template_id": s, "link_id": s, "args": {"?principal": uid, "?resource": uid}}`,
    /// where a uid is `Type::"id"`, `{type, id}` or `{"__entity": {type, id}}`.
    ///
    /// # Errors
    /// [`RequestError`] naming the entry and field at fault.
    pub fn parse_list(value: &Value) -> Result<Vec<Self>, RequestError> {
        let arr = value
            .as_array()
            .ok_or_else(|| RequestError::new("links", "expected a JSON array of links"))?;
        let mut out = Vec::with_capacity(arr.len());
        for (i, item) in arr.iter().enumerate() {
            let field = |f: &str| format!("links[{i}].{f}");
            let obj = item
                .as_object()
                .ok_or_else(|| RequestError::new(format!("links[{i}]"), "expected an object"))?;
            let get_str = |k: &str| -> Result<String, RequestError> {
                obj.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| RequestError::new(field(k), "expected a string"))
            };
            let template_id = get_str("template_id")?;
            let link_id = get_str("link_id")?;
            let mut args = BTreeMap::new();
            if let Some(a) = obj.get("args") {
                let a = a
                    .as_object()
                    .ok_or_else(|| RequestError::new(field("args"), "expected an object"))?;
                for (slot, v) in a {
                    if slot != "?principal" && slot != "?resource" {
                        return Err(RequestError::new(
                            field("args"),
                            format!("unknown slot `{slot}`: expected `?principal` or `?resource`"),
                        ));
                    }
                    let uid = crate::request::parse_uid(v, &format!("links[{i}].args.{slot}"))?;
                    args.insert(slot.clone(), uid);
                }
            }
            out.push(Self {
                template_id,
                link_id,
                args,
            });
        }
        Ok(out)
    }
}

/// A loaded, validated policy bundle. Immutable; the engine swaps whole bundles atomically.
#[derive(Debug)]
pub struct Bundle {
    /// Policies with their real effects, named by [`PolicyMeta::name`].
    pub(crate) policies: PolicySet,
    /// Static and linked policies by id.
    pub(crate) meta: FastMap<PolicyId, PolicyMeta>,
    /// Templates by id.
    pub(crate) template_meta: HashMap<PolicyId, PolicyMeta>,
    /// The schema, when the bundle has one.
    pub(crate) schema: Option<Schema>,
    /// Per action, which of the decision point's own context fields its context declares
    /// (docs/decisions.md); an action missing here takes none.
    pub(crate) injected: FastMap<EntityUid, Declared>,
    /// Action uids by bare id, for resolving `read` to `NS::Action::"read"`.
    actions_by_id: HashMap<String, Vec<EntityUid>>,
    /// Action entities (with their action groups as parents).
    pub(crate) action_entities: FastMap<EntityUid, Arc<StoredEntity>>,
    /// Entities from the bundle's `entities.json`: the base layer under the entity store.
    pub(crate) entities: FastMap<EntityUid, Arc<StoredEntity>>,
    /// Entity type names the schema declares (empty without a schema).
    pub(crate) entity_types: HashSet<String>,
    /// Entity types that may be principals of some action.
    pub(crate) principal_types: HashSet<String>,
    /// Links applied so far, in order.
    pub(crate) links: Vec<TemplateLink>,
    /// Problems that did not stop the load (entities that break the schema).
    pub warnings: Vec<SourceError>,
    /// Every schema action with its transitive ancestors, when the schema fixes the action
    /// hierarchy (what the engine's scope index narrows `action in` scopes with).
    pub(crate) action_ancestors: Option<Arc<ActionAncestors>>,
    /// Lookups that keep checks cheap (parsed type names, actions by text, request types).
    pub(crate) lookups: Lookups,
}

/// Each action's transitive ancestors (action groups), by action uid.
pub(crate) type ActionAncestors = HashMap<EntityUid, HashSet<EntityUid>>;

fn json_err_pos(file: &str, e: &serde_json::Error) -> SourceError {
    SourceError {
        file: file.to_owned(),
        line: u32::try_from(e.line()).ok().filter(|l| *l > 0),
        column: u32::try_from(e.column()).ok().filter(|c| *c > 0),
        policy: None,
        message: format!("invalid JSON: {e}"),
    }
}

/// Converts a byte offset in `text` to a 1-based (line, column in chars).
fn line_col(text: &str, offset: usize) -> (u32, u32) {
    let offset = offset.min(text.len());
    let mut line = 1u32;
    let mut col = 1u32;
    for (i, ch) in text.char_indices() {
        if i >= offset {
            break;
        }
        if ch == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line, col)
}

/// Turns a miette diagnostic into source errors: one per label (or one without position).
fn diag_errors(
    diag: &dyn Diagnostic,
    file: &str,
    text: Option<&str>,
    policy: Option<String>,
) -> Vec<SourceError> {
    let mut message = diag.to_string();
    if let Some(help) = diag.help() {
        message.push_str(&format!(" (help: {help})"));
    }
    let mut out = Vec::new();
    if let Some(labels) = diag.labels() {
        // One position per diagnostic: the primary label is enough to find it.
        if let Some(label) = labels.into_iter().next() {
            let (line, column) = match (diag.source_code(), text) {
                (Some(src), _) => match src.read_span(label.inner(), 0, 0) {
                    Ok(c) => (
                        u32::try_from(c.line() + 1).unwrap_or(u32::MAX),
                        u32::try_from(c.column() + 1).unwrap_or(u32::MAX),
                    ),
                    Err(_) => (0, 0),
                },
                (None, Some(t)) => line_col(t, label.offset()),
                (None, None) => (0, 0),
            };
            out.push(SourceError {
                file: file.to_owned(),
                line: (line > 0).then_some(line),
                column: (column > 0).then_some(column),
                policy: policy.clone(),
                message: message.clone(),
            });
        }
    }
    if out.is_empty() {
        out.push(SourceError {
            file: file.to_owned(),
            line: None,
            column: None,
            policy,
            message,
        });
    }
    out
}

/// Finds the 1-based position of the `nth` occurrence of `needle` at or after `from`.
fn find_pos(text: &str, needle: &str, from: usize) -> Option<(usize, u32, u32)> {
    let rest = text.get(from..)?;
    let at = rest.find(needle)? + from;
    let (l, c) = line_col(text, at);
    Some((at + needle.len(), l, c))
}

/// Parses a `@challenge` annotation value into kinds.
fn parse_challenge(value: &str) -> Result<Vec<String>, String> {
    let mut kinds = Vec::new();
    for part in value.split(',') {
        let k = part.trim();
        if !CHALLENGE_KINDS.contains(&k) {
            return Err(format!(
                "unknown challenge kind `{k}` in `@challenge`: expected one of `verification`, `approval`, `justification`"
            ));
        }
        if !kinds.iter().any(|x| x == k) {
            kinds.push(k.to_owned());
        }
    }
    Ok(kinds)
}

/// Returns the entity type `ns::name`, or `name` for the empty namespace.
pub(crate) fn qualified_type(ns: &str, name: &str) -> Option<EntityTypeName> {
    let full = if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}::{name}")
    };
    EntityTypeName::from_str(&full).ok()
}

/// Which of the decision point's own context fields (`risk_score`, `human_present`, `assigned`,
/// `work_item`, `agent`; docs/decisions.md#context-the-decision-point-fills-in) an action's context
/// declares; each is added to a check's
/// context only where declared (without a schema, always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declared {
    pub(crate) risk_score: bool,
    pub(crate) human_present: bool,
    pub(crate) assigned: bool,
    pub(crate) work_item: bool,
    pub(crate) agent: bool,
}

impl Declared {
    /// Every field (a bundle without a schema).
    pub(crate) const ALL: Self = Self {
        risk_score: true,
        human_present: true,
        assigned: true,
        work_item: true,
        agent: true,
    };
    /// No field (an action whose context could not be read from the schema).
    pub(crate) const NONE: Self = Self {
        risk_score: false,
        human_present: false,
        assigned: false,
        work_item: false,
        agent: false,
    };

    /// The fields among an action's declared context attribute names (`None`: not known).
    fn of(attrs: Option<&HashSet<String>>) -> Self {
        let Some(a) = attrs else { return Self::NONE };
        Self {
            risk_score: a.contains("risk_score"),
            human_present: a.contains("human_present"),
            assigned: a.contains("assigned"),
            work_item: a.contains("work_item"),
            agent: a.contains("agent"),
        }
    }
}

/// Reads the declared context attribute names of every action from the schema's JSON form.
fn context_attrs_of(schema_json: &Value) -> HashMap<EntityUid, Option<HashSet<String>>> {
    let mut out = HashMap::new();
    let Some(namespaces) = schema_json.as_object() else {
        return out;
    };
    for (ns, body) in namespaces {
        let Some(actions) = body.get("actions").and_then(Value::as_object) else {
            continue;
        };
        let Some(action_ty) = qualified_type(ns, "Action") else {
            continue;
        };
        for (aid, adef) in actions {
            let uid = EntityUid::from_type_name_and_id(action_ty.clone(), EntityId::new(aid));
            let ctx = adef.get("appliesTo").and_then(|a| a.get("context"));
            let attrs = match ctx {
                None => Some(HashSet::new()),
                Some(t) => resolve_record(t, ns, namespaces, 0),
            };
            out.insert(uid, attrs);
        }
    }
    out
}

fn resolve_record(
    t: &Value,
    ns: &str,
    namespaces: &serde_json::Map<String, Value>,
    depth: u8,
) -> Option<HashSet<String>> {
    if depth > 16 {
        return None;
    }
    if let Some(attrs) = t.get("attributes").and_then(Value::as_object) {
        return Some(attrs.keys().cloned().collect());
    }
    let ty = t.get("type").and_then(Value::as_str)?;
    let name = if ty == "EntityOrCommon" {
        t.get("name").and_then(Value::as_str)?
    } else {
        ty
    };
    let (target_ns, base) = match name.rfind("::") {
        Some(i) => (name.get(..i)?, name.get(i + 2..)?),
        None => (ns, name),
    };
    for candidate in [target_ns, ""] {
        if let Some(def) = namespaces
            .get(candidate)
            .and_then(|b| b.get("commonTypes"))
            .and_then(|c| c.get(base))
        {
            return resolve_record(def, candidate, namespaces, depth + 1);
        }
    }
    None
}

/// Parses `entities.json` into JSON entities in Cedar's format, accepting Cedar's array format
/// and the entity-map format of Cedar's TinyTodo example (`{group: {"T::\"id\"": {euid, parents,
/// ...attrs}}}`).
fn normalize_entities(file: &str, value: Value) -> Result<Vec<Value>, SourceError> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(map) => {
            let mut out = Vec::new();
            for (group, v) in map {
                let Value::Object(obj) = v else {
                    return Err(SourceError::file(
                        file,
                        format!("entity map group `{group}` is not an object"),
                    ));
                };
                if obj.contains_key("euid") || obj.contains_key("uid") {
                    out.push(map_entity(file, &group, obj)?);
                } else {
                    for (key, e) in obj {
                        let Value::Object(eobj) = e else {
                            return Err(SourceError::file(
                                file,
                                format!("entity `{key}` in group `{group}` is not an object"),
                            ));
                        };
                        out.push(map_entity(file, &key, eobj)?);
                    }
                }
            }
            Ok(out)
        }
        _ => Err(SourceError::file(
            file,
            "expected a JSON array of entities or an entity map",
        )),
    }
}

fn uid_json(file: &str, key: &str, v: &Value) -> Result<Value, SourceError> {
    let uid = crate::request::parse_uid(v, key).map_err(|e| SourceError::file(file, e.message))?;
    Ok(serde_json::json!({"type": uid.type_name().to_string(), "id": uid.id().unescaped()}))
}

fn map_entity(
    file: &str,
    key: &str,
    mut obj: serde_json::Map<String, Value>,
) -> Result<Value, SourceError> {
    let uid_v = obj
        .remove("euid")
        .or_else(|| obj.remove("uid"))
        .unwrap_or_else(|| Value::String(key.to_owned()));
    let uid = uid_json(file, key, &uid_v)?;
    let parents = match obj.remove("parents") {
        None => Vec::new(),
        Some(Value::Array(ps)) => ps
            .iter()
            .map(|p| uid_json(file, key, p))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(SourceError::file(
                file,
                format!("`parents` of entity `{key}` is not an array"),
            ))
        }
    };
    Ok(serde_json::json!({"uid": uid, "attrs": Value::Object(obj), "parents": parents}))
}

impl Bundle {
    /// Parses, names and validates a bundle.
    ///
    /// ```
    /// use pdp_core::{Bundle, BundleSources};
    ///
    /// let bundle = Bundle::from_sources(&BundleSources {
    ///     policies: vec![(
    ///         "docs.cedar".into(),
    ///         r#"@id("owners-read") permit (principal, action == Action::"read", resource is Doc)
    ///            when { resource.owner == principal };"#
    ///             .into(),
    ///     )],
    ///     schema: Some((
    ///         "docs.cedarschema".into(),
    ///         "entity Human; entity Doc = { owner: Human };
    ///          action read appliesTo { principal: [Human], resource: [Doc] };"
    ///             .into(),
    ///     )),
    ///     entities: Some((
    ///         "entities.json".into(),
    ///         r#"[{"uid": {"type": "Human", "id": "ann"}, "attrs": {}, "parents": []},
    ///             {"uid": {"type": "Doc", "id": "d1"},
    ///              "attrs": {"owner": {"__entity": {"type": "Human", "id": "ann"}}}, "parents": []}]"#
    ///             .into(),
    ///     )),
    ///     links: None,
    /// })?;
    /// assert!(bundle.policy_meta().any(|p| p.name == "owners-read"));
    /// # Ok::<(), pdp_core::BundleError>(())
    /// ```
    ///
    /// # Errors
    /// [`BundleError`] listing every parse error, validation error (strict mode), bad annotation,
    /// duplicate policy name, schema error, entity error and link error, each with its position.
    pub fn from_sources(src: &BundleSources) -> Result<Self, BundleError> {
        let mut errors: Vec<SourceError> = Vec::new();

        // --- schema -------------------------------------------------------------------------
        let mut schema = None;
        let mut schema_json = None;
        if let Some((name, text)) = &src.schema {
            let is_json = name.ends_with(".json")
                || (name.starts_with('<') && text.trim_start().starts_with('{'));
            if is_json {
                match serde_json::from_str::<Value>(text) {
                    Err(e) => errors.push(json_err_pos(name, &e)),
                    Ok(v) => match Schema::from_json_value(v.clone()) {
                        Ok(s) => {
                            schema = Some(s);
                            schema_json = Some(v);
                        }
                        Err(e) => errors.extend(diag_errors(&e, name, Some(text), None)),
                    },
                }
            } else {
                match SchemaFragment::from_cedarschema_str(text) {
                    Err(e) => errors.extend(diag_errors(&e, name, Some(text), None)),
                    Ok((frag, _warnings)) => {
                        let json = frag.to_json_value().ok();
                        match Schema::from_cedarschema_str(text) {
                            Ok((s, _)) => {
                                schema = Some(s);
                                schema_json = json;
                            }
                            Err(e) => errors.extend(diag_errors(&e, name, Some(text), None)),
                        }
                    }
                }
            }
        }

        // --- policies -----------------------------------------------------------------------
        let mut policies = PolicySet::new();
        let mut meta: FastMap<PolicyId, PolicyMeta> = FastMap::default();
        let mut template_meta: HashMap<PolicyId, PolicyMeta> = HashMap::new();
        let mut file_of: HashMap<PolicyId, (String, String)> = HashMap::new();
        let mut offset = 0usize;
        for (file, text) in &src.policies {
            let parsed = match PolicySet::from_str(text) {
                Ok(p) => p,
                Err(errs) => {
                    for e in errs.iter() {
                        errors.extend(diag_errors(e, file, Some(text), None));
                    }
                    continue;
                }
            };
            // Statement order: Cedar numbers statements `policy0`, `policy1`, ...
            let mut stmts: Vec<(usize, Option<&Policy>, Option<&Template>)> = Vec::new();
            for p in parsed.policies() {
                stmts.push((stmt_index(p.id()), Some(p), None));
            }
            for t in parsed.templates() {
                stmts.push((stmt_index(t.id()), None, Some(t)));
            }
            stmts.sort_by_key(|s| s.0);
            let count = stmts.len();
            let mut cursor = 0usize;
            for (idx, p, t) in stmts {
                let annotations: Vec<(&str, &str)> = match (p, t) {
                    (Some(p), _) => p.annotations().collect(),
                    (_, Some(t)) => t.annotations().collect(),
                    _ => continue,
                };
                let id_ann = annotations
                    .iter()
                    .find(|(k, _)| *k == "id")
                    .map(|(_, v)| *v);
                let name = match id_ann {
                    Some(v) => v.to_owned(),
                    None => format!("policy{}", offset + idx),
                };
                // Position of this policy's annotations, for errors that Cedar cannot place.
                let pos = id_ann.and_then(|v| {
                    let needle = format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
                    find_pos(text, &needle, cursor)
                });
                if let Some((end, _, _)) = pos {
                    cursor = end;
                }
                let pid = PolicyId::new(&name);
                if meta.contains_key(&pid) || template_meta.contains_key(&pid) {
                    let prev = file_of.get(&pid).map(|f| f.0.clone()).unwrap_or_default();
                    errors.push(SourceError {
                        file: file.clone(),
                        line: pos.map(|p| p.1),
                        column: pos.map(|p| p.2),
                        policy: Some(name.clone()),
                        message: format!("duplicate policy name `{name}` (also used in `{prev}`)"),
                    });
                    continue;
                }
                let challenges = match annotations.iter().find(|(k, _)| *k == "challenge") {
                    None => Vec::new(),
                    Some((_, v)) => match parse_challenge(v) {
                        Ok(c) => c,
                        Err(msg) => {
                            let cpos = find_pos(text, &format!("@challenge(\"{v}\")"), 0);
                            errors.push(SourceError {
                                file: file.clone(),
                                line: cpos.map(|p| p.1),
                                column: cpos.map(|p| p.2),
                                policy: Some(name.clone()),
                                message: msg,
                            });
                            continue;
                        }
                    },
                };
                file_of.insert(pid.clone(), (file.clone(), text.clone()));
                let result = match (p, t) {
                    (Some(p), _) => {
                        let renamed = p.new_id(pid.clone());
                        let m = PolicyMeta {
                            name: name.clone(),
                            effect: renamed.effect(),
                            challenges,
                            file: file.clone(),
                        };
                        meta.insert(pid.clone(), m);
                        policies.add(renamed).map_err(|e| chain(&e))
                    }
                    (_, Some(t)) => {
                        let renamed = t.new_id(pid.clone());
                        let m = PolicyMeta {
                            name: name.clone(),
                            effect: renamed.effect(),
                            challenges,
                            file: file.clone(),
                        };
                        template_meta.insert(pid.clone(), m);
                        policies.add_template(renamed).map_err(|e| chain(&e))
                    }
                    _ => Ok(()),
                };
                if let Err(msg) = result {
                    errors.push(SourceError {
                        file: file.clone(),
                        line: pos.map(|p| p.1),
                        column: pos.map(|p| p.2),
                        policy: Some(name),
                        message: msg,
                    });
                }
            }
            offset += count;
        }

        // --- base entities ------------------------------------------------------------------
        let mut entities = FastMap::default();
        let mut warnings: Vec<SourceError> = Vec::new();
        if let (Some((name, text)), true) = (&src.entities, errors.is_empty()) {
            match serde_json::from_str::<Value>(text) {
                Err(e) => errors.push(json_err_pos(name, &e)),
                Ok(v) => match normalize_entities(name, v) {
                    Err(e) => errors.push(e),
                    Ok(list) => {
                        // Each entity is typed by the schema when the schema declares its type;
                        // entities of other types (Cedar's examples have some) load as plain
                        // Cedar JSON, so every example application loads as it stands.
                        let declared: HashSet<String> = schema
                            .as_ref()
                            .map(|s| s.entity_types().map(ToString::to_string).collect())
                            .unwrap_or_default();
                        for (i, v) in list.into_iter().enumerate() {
                            let field = format!("entities[{i}]");
                            let typed = StoredEntity::from_json(
                                v.clone(),
                                schema.as_ref(),
                                &declared,
                                &field,
                            );
                            // An entity that breaks the schema still loads as plain Cedar JSON,
                            // with a warning: Cedar's own example data does (github_example gives
                            // users `Organization` parents, document_cloud a `Document` where a
                            // `DocumentShare` is declared), and Cedar evaluates it as written.
                            // Store updates through the engine's API stay strict.
                            let parsed = match typed {
                                Ok(se) => Ok(se),
                                Err(e) => match StoredEntity::from_json(v, None, &declared, &field)
                                {
                                    Ok(se) => {
                                        warnings.push(SourceError::file(name, e.to_string()));
                                        Ok(se)
                                    }
                                    Err(_) => Err(e),
                                },
                            };
                            match parsed {
                                Err(e) => errors.push(SourceError::file(name, e.to_string())),
                                Ok(se) => {
                                    let uid = se.entity.uid();
                                    if uid.type_name().basename() == "Action" {
                                        continue;
                                    }
                                    if entities.insert(uid.clone(), Arc::new(se)).is_some() {
                                        errors.push(SourceError::file(
                                            name,
                                            format!("duplicate entity `{uid}`"),
                                        ));
                                    }
                                }
                            }
                        }
                        // Closing the hierarchy costs the square of its depth: refuse an
                        // over-deep one here, before any engine closes it.
                        if let Err(e) = crate::store::check_depth(entities.keys(), &|u| {
                            entities.get(u).map(|e| crate::store::Written::Stored(e))
                        }) {
                            errors.push(SourceError::file(name, e.to_string()));
                        }
                    }
                },
            }
        }

        // --- schema-derived indexes ---------------------------------------------------------
        let mut actions_by_id: HashMap<String, Vec<EntityUid>> = HashMap::new();
        let mut action_entities = FastMap::default();
        let mut entity_types = HashSet::new();
        let mut principal_types = HashSet::new();
        if let Some(s) = &schema {
            for a in s.actions() {
                actions_by_id
                    .entry(a.id().unescaped().to_owned())
                    .or_default()
                    .push(a.clone());
            }
            if let Ok(aes) = s.action_entities() {
                for e in aes.iter() {
                    action_entities.insert(e.uid(), Arc::new(StoredEntity::from_entity(e.clone())));
                }
            }
            entity_types = s.entity_types().map(ToString::to_string).collect();
            principal_types = s.principals().map(ToString::to_string).collect();
        }
        let injected = schema_json
            .as_ref()
            .map(context_attrs_of)
            .unwrap_or_default()
            .into_iter()
            .map(|(a, attrs)| (a, Declared::of(attrs.as_ref())))
            .collect();

        let action_ancestors =
            action_ancestors(schema.is_some(), &action_entities, &entity_types).map(Arc::new);
        let mut lookups = Lookups::new(schema.as_ref(), schema_json.as_ref());
        // Only actions with an entity resolve by their text, so a hit needs no second lookup.
        lookups
            .actions_by_text
            .retain(|_, a| action_entities.contains_key(a));
        let mut bundle = Self {
            action_ancestors,
            lookups,
            policies,
            meta,
            template_meta,
            schema,
            injected,
            actions_by_id,
            action_entities,
            entities,
            entity_types,
            principal_types,
            links: Vec::new(),
            warnings,
        };

        // --- template links -----------------------------------------------------------------
        if let (Some((name, text)), true) = (&src.links, errors.is_empty()) {
            match serde_json::from_str::<Value>(text) {
                Err(e) => errors.push(json_err_pos(name, &e)),
                Ok(v) => match TemplateLink::parse_list(&v) {
                    Err(e) => errors.push(SourceError::file(name, e.to_string())),
                    Ok(links) => {
                        for l in &links {
                            if let Err(msg) = bundle.apply_link(l) {
                                errors.push(SourceError {
                                    file: name.clone(),
                                    line: None,
                                    column: None,
                                    policy: Some(l.link_id.clone()),
                                    message: msg,
                                });
                            }
                        }
                    }
                },
            }
        }

        // --- strict validation --------------------------------------------------------------
        if errors.is_empty() {
            if let Some(s) = &bundle.schema {
                errors.extend(validate(
                    &bundle.policies,
                    s,
                    &bundle.meta,
                    &bundle.template_meta,
                    &file_of,
                ));
            }
        }

        if errors.is_empty() {
            Ok(bundle)
        } else {
            Err(BundleError { errors })
        }
    }

    /// Returns a new bundle with `links` applied (all or nothing), validated against the schema.
    ///
    /// # Errors
    /// [`BundleError`] naming each link that refers to an unknown template, reuses a policy
    /// name, misses or adds a slot, or makes a policy that fails validation.
    pub fn with_links(&self, links: &[TemplateLink]) -> Result<Self, BundleError> {
        let mut next = self.clone_shallow();
        let mut errors = Vec::new();
        for l in links {
            if let Err(msg) = next.apply_link(l) {
                errors.push(SourceError {
                    file: "<links>".to_owned(),
                    line: None,
                    column: None,
                    policy: Some(l.link_id.clone()),
                    message: msg,
                });
            }
        }
        if errors.is_empty() {
            if let Some(s) = &next.schema {
                errors.extend(validate(
                    &next.policies,
                    s,
                    &next.meta,
                    &next.template_meta,
                    &HashMap::new(),
                ));
            }
        }
        if errors.is_empty() {
            Ok(next)
        } else {
            Err(BundleError { errors })
        }
    }

    fn clone_shallow(&self) -> Self {
        Self {
            policies: self.policies.clone(),
            meta: self.meta.clone(),
            template_meta: self.template_meta.clone(),
            schema: self.schema.clone(),
            injected: self.injected.clone(),
            actions_by_id: self.actions_by_id.clone(),
            action_entities: self.action_entities.clone(),
            entities: self.entities.clone(),
            entity_types: self.entity_types.clone(),
            principal_types: self.principal_types.clone(),
            links: self.links.clone(),
            warnings: self.warnings.clone(),
            action_ancestors: self.action_ancestors.clone(),
            lookups: self.lookups.clone(),
        }
    }

    fn apply_link(&mut self, l: &TemplateLink) -> Result<(), String> {
        let tid = PolicyId::new(&l.template_id);
        let Some(tmeta) = self.template_meta.get(&tid).cloned() else {
            return Err(format!("unknown template `{}`", l.template_id));
        };
        let lid = PolicyId::new(&l.link_id);
        if self.meta.contains_key(&lid) || self.template_meta.contains_key(&lid) {
            return Err(format!("duplicate policy name `{}`", l.link_id));
        }
        let vals: HashMap<SlotId, EntityUid> = l
            .args
            .iter()
            .map(|(k, v)| {
                let slot = if k == "?principal" {
                    SlotId::principal()
                } else {
                    SlotId::resource()
                };
                (slot, v.clone())
            })
            .collect();
        self.policies
            .link(tid, lid.clone(), vals)
            .map_err(|e| chain(&e))?;
        self.meta.insert(
            lid,
            PolicyMeta {
                name: l.link_id.clone(),
                ..tmeta
            },
        );
        self.links.push(l.clone());
        Ok(())
    }

    /// Resolves an action string (`read`, `Action::"read"`, `NS::Action::"read"`) to its uid.
    ///
    /// # Errors
    /// [`RequestError`] on `action` when the action is unknown to the schema, or a bare id
    /// names actions in more than one namespace.
    pub fn resolve_action(&self, action: &str) -> Result<EntityUid, RequestError> {
        // The written form of a schema action (what `EntityUid`'s parser would return).
        if let Some(uid) = self.lookups.actions_by_text.get(action) {
            return Ok(uid.clone());
        }
        if action.contains("::\"") {
            let uid = EntityUid::from_str(action).map_err(|e| {
                RequestError::new("action", format!("`{action}` is not an action uid: {e}"))
            })?;
            if self.schema.is_some() && !self.action_entities.contains_key(&uid) {
                return Err(RequestError::new(
                    "action",
                    format!("unknown action `{action}`"),
                ));
            }
            return Ok(uid);
        }
        if self.schema.is_none() {
            let ty = EntityTypeName::from_str("Action")
                .map_err(|e| RequestError::new("action", e.to_string()))?;
            return Ok(EntityUid::from_type_name_and_id(ty, EntityId::new(action)));
        }
        match self.actions_by_id.get(action).map(Vec::as_slice) {
            Some([one]) => Ok(one.clone()),
            Some(many) if many.len() > 1 => {
                let list: Vec<String> = many.iter().map(|u| format!("`{u}`")).collect();
                Err(RequestError::new(
                    "action",
                    format!(
                        "action `{action}` is ambiguous: it names {}; use the full form",
                        list.join(", ")
                    ),
                ))
            }
            _ => Err(RequestError::new(
                "action",
                format!("unknown action `{action}`"),
            )),
        }
    }

    /// Checks that `ty` is an entity type the schema declares (always true without a schema).
    ///
    /// # Errors
    /// [`RequestError`] on `field` naming the unknown type.
    pub fn check_type(&self, ty: &EntityTypeName, field: &str) -> Result<(), RequestError> {
        if self.schema.is_none() || self.lookups.type_names.contains(ty) {
            Ok(())
        } else {
            Err(RequestError::new(
                field,
                format!("unknown entity type `{ty}`"),
            ))
        }
    }

    /// Resolves an entity type name as a client writes it: the full name (`NS::Document`), or
    /// a bare name (`Document`) when exactly one declared type has it. Without a schema any
    /// valid name is accepted.
    ///
    /// # Errors
    /// [`RequestError`] on `field` when the name is not valid, not declared, or ambiguous.
    pub fn resolve_type(&self, name: &str, field: &str) -> Result<EntityTypeName, RequestError> {
        // A declared type written in full: what the parser and the check below would return.
        if let Some(t) = self.lookups.types_by_text.get(name) {
            return Ok(t.clone());
        }
        let parsed = EntityTypeName::from_str(name).map_err(|e| {
            RequestError::new(
                field,
                format!("`{name}` is not a valid entity type name: {e}"),
            )
        })?;
        if self.schema.is_none() || self.entity_types.contains(name) {
            return Ok(parsed);
        }
        let mut found: Vec<&String> = self
            .entity_types
            .iter()
            .filter(|t| t.rsplit("::").next() == Some(name))
            .collect();
        found.sort();
        match found.as_slice() {
            [one] => EntityTypeName::from_str(one)
                .map_err(|e| RequestError::new(field, format!("`{one}`: {e}"))),
            [] => Err(RequestError::new(
                field,
                format!("unknown entity type `{name}`"),
            )),
            many => Err(RequestError::new(
                field,
                format!(
                    "entity type `{name}` is ambiguous: write one of {}",
                    many.iter()
                        .map(|t| format!("`{t}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }

    /// Finds the schema's entity type whose base name is `base` (for example the bundle's
    /// `ServiceAccount` or `WorkItem`), or the unqualified name without a schema or match.
    pub(crate) fn type_named(&self, base: &str) -> Option<EntityTypeName> {
        let mut found: Vec<&String> = self
            .entity_types
            .iter()
            .filter(|t| t.rsplit("::").next() == Some(base))
            .collect();
        found.sort();
        match found.first() {
            Some(t) => EntityTypeName::from_str(t).ok(),
            None => EntityTypeName::from_str(base).ok(),
        }
    }

    /// Whether policy `id` is a plain forbid: a `forbid` without `@challenge`, which denies
    /// whatever else is satisfied (docs/decisions.md#one-principals-verdict). Unknown ids are not.
    pub(crate) fn is_plain_forbid(&self, id: &PolicyId) -> bool {
        self.meta
            .get(id)
            .is_some_and(|m| m.effect == Effect::Forbid && m.challenges.is_empty())
    }

    /// Whether entities of type `ty` count as principals (for `principals_version`).
    /// Whether entities of `ty` come only from the directory (`Human`, `ServiceAccount`,
    /// `Group`, in any namespace): inline data never creates or changes them.
    pub(crate) fn is_directory_type(&self, ty: &EntityTypeName) -> bool {
        matches!(ty.basename(), "Human" | "ServiceAccount" | "Group")
    }

    pub(crate) fn is_principal_type(&self, ty: &EntityTypeName) -> bool {
        matches!(ty.basename(), "Human" | "ServiceAccount" | "Group")
            || self.principal_types.contains(&ty.to_string())
    }

    /// Policy names with metadata (static and linked policies).
    pub fn policy_meta(&self) -> impl Iterator<Item = &PolicyMeta> {
        self.meta.values()
    }

    /// The schema, if the bundle has one.
    pub fn schema(&self) -> Option<&Schema> {
        self.schema.as_ref()
    }

    /// The bundle's policy set with real effects.
    pub fn policy_set(&self) -> &PolicySet {
        &self.policies
    }

    /// The base entities from the bundle's `entities.json` (any of its formats), in no
    /// particular order; action entities are not among them.
    pub fn entities(&self) -> impl Iterator<Item = &Entity> {
        self.entities.values().map(|se| &se.entity)
    }
}

/// Every schema action with all its (transitive) ancestors, for pruning `action in` scopes; `None`
/// without a schema, or when a declared entity type shares an action's type name (an entity of
/// that type could then stand in for an action in a check).
fn action_ancestors(
    has_schema: bool,
    actions: &FastMap<EntityUid, Arc<StoredEntity>>,
    entity_types: &HashSet<String>,
) -> Option<HashMap<EntityUid, HashSet<EntityUid>>> {
    if !has_schema
        || actions
            .keys()
            .any(|a| entity_types.contains(&a.type_name().to_string()))
    {
        return None;
    }
    let mut out = HashMap::with_capacity(actions.len());
    for (uid, se) in actions {
        let mut seen: HashSet<EntityUid> = HashSet::new();
        let mut stack: Vec<&EntityUid> = se.parents.iter().collect();
        while let Some(p) = stack.pop() {
            if seen.insert(p.clone()) {
                if let Some(pe) = actions.get(p) {
                    stack.extend(pe.parents.iter());
                }
            }
        }
        out.insert(uid.clone(), seen);
    }
    Some(out)
}

fn stmt_index(id: &PolicyId) -> usize {
    id.to_string()
        .strip_prefix("policy")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

fn validate(
    pset: &PolicySet,
    schema: &Schema,
    meta: &FastMap<PolicyId, PolicyMeta>,
    template_meta: &HashMap<PolicyId, PolicyMeta>,
    file_of: &HashMap<PolicyId, (String, String)>,
) -> Vec<SourceError> {
    let validator = Validator::new(schema.clone());
    let result = validator.validate(pset, ValidationMode::Strict);
    let mut out = Vec::new();
    for e in result.validation_errors() {
        let pid = e.policy_id();
        let m = meta.get(pid).or_else(|| template_meta.get(pid));
        let file = m
            .map(|m| m.file.clone())
            .unwrap_or_else(|| "<policies>".to_owned());
        let text = file_of.get(pid).map(|f| f.1.as_str());
        out.extend(diag_errors(e, &file, text, Some(pid.to_string())));
    }
    out.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
    out
}
