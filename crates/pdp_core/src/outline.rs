//! What each policy of a Cedar file is and what it reads, from Cedar's own parse (the portal's
//! explanations, docs/portal.md#explanations).
//!
//! [`outline`] parses one `.cedar` file with `cedar-policy` and walks each policy's and
//! template's AST (`cedar_policy_core::ast`), never its text, for:
//!
//! * its name, as a bundle names it (docs/bundles.md#policy-names): the `@id("...")`
//!   annotation, else Cedar's `policyN` counted from `first_index` (the statements of the
//!   bundle's earlier files, in file-name order);
//! * its effect, and its source text exactly as written, annotations to the closing `;` (Cedar's
//!   source location of the statement), with its 1-based first and last line in the file;
//! * its scope: the principal, action and resource constraints (`==`, `in`, `is`, `is ... in`,
//!   a template's slots);
//! * the attribute paths its conditions read (`principal.department`) or test with `has`
//!   (`principal has manager`, and `context has a.b` as `context.a.b`), each kept whole
//!   (`resource.owner.manager`, not its prefixes), with the lines it appears on. A path is
//!   rooted at a variable (`principal`, `action`, `resource`, `context`), at an entity literal
//!   (`Group::"admins".lead`) or, when Cedar reads an attribute off any other expression
//!   (`(if c then principal else resource).owner`, a record literal), at that expression's
//!   Cedar text. `e.getTag("k")`/`e.hasTag("k")` with a literal key are read paths with a tag;
//! * the entity literals it names, scope included (`Group::"admins"`, `Action::"read"`).
//!
//! Cedar has no variables of its own beyond the four, so nothing else can be named.

use crate::error::{BundleError, SourceError};
use cedar_policy::PolicySet;
use cedar_policy_core::ast::{
    ActionConstraint, BinaryOp, EntityReference, EntityUID, Expr, ExprKind, Literal,
    PrincipalOrResourceConstraint, Template, Var,
};
use miette::Diagnostic;
use serde::Serialize;
use smol_str::SmolStr;
use std::str::FromStr;

/// One policy or template of a file, as [`outline`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyOutline {
    /// The policy's name in a bundle: `@id` or Cedar's `policyN` (docs/bundles.md#policy-names).
    pub name: String,
    /// `permit` or `forbid`.
    pub effect: &'static str,
    /// Whether it is a template (it has `?principal` or `?resource` slots).
    pub template: bool,
    /// The statement as written, from its first annotation to its `;`.
    pub text: String,
    /// 1-based line of the file the statement starts on.
    pub start_line: u32,
    /// 1-based line of the file the statement ends on.
    pub end_line: u32,
    /// The scope's three constraints.
    pub scope: Scope,
    /// The attribute paths the conditions read or test, in order of first appearance.
    pub reads: Vec<Read>,
    /// The entity literals it names (scope and conditions), as Cedar writes them, in order of
    /// first appearance, each once.
    pub entities: Vec<String>,
}

/// A policy's scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scope {
    /// The principal constraint.
    pub principal: Constraint,
    /// The action constraint (`op` is `any`, `==` or `in`).
    pub action: Constraint,
    /// The resource constraint.
    pub resource: Constraint,
}

/// One scope constraint: `op` is `any` (unconstrained), `==`, `in`, `is` or `is in`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Constraint {
    /// `any`, `==`, `in`, `is` or `is in`.
    pub op: &'static str,
    /// The entities compared with (several for `action in [...]`), as Cedar writes them.
    pub entities: Vec<String>,
    /// The entity type of `is` and `is in`.
    pub entity_type: Option<String>,
    /// The template slot compared with (`?principal`, `?resource`), if any.
    pub slot: Option<String>,
}

/// One attribute path a policy reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Read {
    /// The path as Cedar would write it: `principal.department`, `context.risk_score`,
    /// `resource["first name"]`, `Group::"admins".lead`, `resource.getTag("owner")`.
    pub path: String,
    /// What the path starts at: a variable name, an entity literal or an expression's text.
    pub root: String,
    /// `variable`, `entity` or `expression`.
    pub root_kind: &'static str,
    /// The entity literal the path starts at, when `root_kind` is `entity`.
    pub root_entity: Option<EntityRef>,
    /// The attribute names after the root, in order.
    pub attrs: Vec<SmolStr>,
    /// The tag read at the end of the path (`getTag`/`hasTag` with a literal key), if any.
    pub tag: Option<SmolStr>,
    /// Whether the policy reads the value (`.attr`, `getTag`).
    pub read: bool,
    /// Whether the policy tests its presence (`has`, `hasTag`).
    pub has: bool,
    /// The 1-based lines of the file it appears on, ascending.
    pub lines: Vec<u32>,
}

/// An entity literal as `{"type", "id"}` (the id unescaped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EntityRef {
    /// The entity type's name, namespace included (`Acme::Group`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// The entity's id, as Cedar holds it (escapes resolved).
    pub id: String,
}

/// Outlines every policy and template of one `.cedar` file (see the module docs).
///
/// `file` names the file in errors; `first_index` is the number of statements in the bundle's
/// files before this one (0 for the first or only file), so unnamed policies get the names the
/// bundle gives them. Statements come back in file order.
///
/// # Errors
/// [`BundleError`] with Cedar's parse errors, each with `file`, its 1-based line and column, and
/// Cedar's message (and help).
pub fn outline(
    file: &str,
    text: &str,
    first_index: usize,
) -> Result<Vec<PolicyOutline>, BundleError> {
    let lines = LineIndex::new(text);
    let set = PolicySet::from_str(text).map_err(|errs| BundleError {
        errors: errs.iter().map(|e| parse_error(file, e, &lines)).collect(),
    })?;
    let mut stmts: Vec<(usize, &Template)> = Vec::new();
    for p in set.policies() {
        let ast: &cedar_policy_core::ast::Policy = p.as_ref();
        stmts.push((stmt_index(p.id().as_ref()), ast.template()));
    }
    for t in set.templates() {
        stmts.push((stmt_index(t.id().as_ref()), t.as_ref()));
    }
    stmts.sort_by_key(|s| s.0);
    Ok(stmts
        .into_iter()
        .map(|(idx, t)| outline_one(t, idx.saturating_add(first_index), text, &lines))
        .collect())
}

/// The statement's index in its file: Cedar names statement `i` `policy{i}` while parsing.
fn stmt_index(id: &str) -> usize {
    id.strip_prefix("policy")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

fn parse_error(file: &str, e: &dyn Diagnostic, lines: &LineIndex) -> SourceError {
    let mut message = e.to_string();
    if let Some(help) = e.help() {
        message.push_str(&format!(" (help: {help})"));
    }
    let at = e
        .labels()
        .and_then(|mut l| l.next())
        .map(|l| lines.line_col(l.offset()));
    SourceError {
        file: file.to_owned(),
        line: at.map(|a| a.0),
        column: at.map(|a| a.1),
        policy: None,
        message,
    }
}

fn outline_one(t: &Template, index: usize, text: &str, lines: &LineIndex) -> PolicyOutline {
    let name = t
        .annotations()
        .find(|(k, _)| k.as_ref() == "id")
        .map_or_else(|| format!("policy{index}"), |(_, v)| v.val.to_string());
    let (start, end) = t.loc().map_or((0, text.len()), |l| (l.start(), l.end()));
    let source = text.get(start..end).unwrap_or_default().to_owned();
    let mut walk = Walk {
        lines,
        reads: Vec::new(),
        entities: Vec::new(),
    };
    let principal = walk.scope_constraint(t.principal_constraint().as_inner(), "?principal");
    let action = match t.action_constraint() {
        ActionConstraint::Eq(e) => {
            walk.entity(e.to_string());
            Constraint {
                op: "==",
                entities: vec![e.to_string()],
                entity_type: None,
                slot: None,
            }
        }
        ActionConstraint::In(es) => {
            for e in es {
                walk.entity(e.to_string());
            }
            Constraint {
                op: "in",
                entities: es.iter().map(ToString::to_string).collect(),
                entity_type: None,
                slot: None,
            }
        }
        _ => any(),
    };
    let resource = walk.scope_constraint(t.resource_constraint().as_inner(), "?resource");
    if let Some(cond) = t.non_scope_constraints() {
        walk.expr(cond);
    }
    for r in &mut walk.reads {
        r.lines.sort_unstable();
        r.lines.dedup();
    }
    PolicyOutline {
        name,
        effect: match t.effect() {
            cedar_policy_core::ast::Effect::Permit => "permit",
            cedar_policy_core::ast::Effect::Forbid => "forbid",
        },
        template: !t.is_static(),
        text: source,
        start_line: lines.line_col(start).0,
        end_line: lines.line_col(end.saturating_sub(1).max(start)).0,
        scope: Scope {
            principal,
            action,
            resource,
        },
        reads: walk.reads,
        entities: walk.entities,
    }
}

fn any() -> Constraint {
    Constraint {
        op: "any",
        entities: Vec::new(),
        entity_type: None,
        slot: None,
    }
}

/// What a policy's walk has found so far.
struct Walk<'a> {
    lines: &'a LineIndex<'a>,
    reads: Vec<Read>,
    entities: Vec<String>,
}

/// Where an attribute path starts.
enum Root<'e> {
    Var(Var),
    Entity(&'e EntityUID),
    Expr(&'e Expr),
}

impl Walk<'_> {
    fn entity(&mut self, uid: String) {
        if !self.entities.contains(&uid) {
            self.entities.push(uid);
        }
    }

    fn scope_constraint(&mut self, c: &PrincipalOrResourceConstraint, slot: &str) -> Constraint {
        let mut reference = |r: &EntityReference, out: &mut Constraint| match r {
            EntityReference::EUID(e) => {
                self.entity(e.to_string());
                out.entities.push(e.to_string());
            }
            EntityReference::Slot(_) => out.slot = Some(slot.to_owned()),
        };
        let mut out = any();
        match c {
            PrincipalOrResourceConstraint::Any => {}
            PrincipalOrResourceConstraint::Eq(r) => {
                out.op = "==";
                reference(r, &mut out);
            }
            PrincipalOrResourceConstraint::In(r) => {
                out.op = "in";
                reference(r, &mut out);
            }
            PrincipalOrResourceConstraint::Is(t) => {
                out.op = "is";
                out.entity_type = Some(t.to_string());
            }
            PrincipalOrResourceConstraint::IsIn(t, r) => {
                out.op = "is in";
                out.entity_type = Some(t.to_string());
                reference(r, &mut out);
            }
        }
        out
    }

    /// Walks an expression, recording the paths it reads and the entity literals it names.
    fn expr(&mut self, e: &Expr) {
        match e.expr_kind() {
            ExprKind::Lit(Literal::EntityUID(uid)) => self.entity(uid.to_string()),
            ExprKind::GetAttr { expr, attr } => self.path(e, expr, vec![attr.clone()], None, true),
            ExprKind::HasAttr { expr, attr } => self.path(e, expr, vec![attr.clone()], None, false),
            ExprKind::ExtHasAttr { expr, attrs } => {
                self.path(e, expr, attrs.iter().cloned().collect(), None, false);
            }
            ExprKind::BinaryApp { op, arg1, arg2 }
                if matches!(op, BinaryOp::GetTag | BinaryOp::HasTag)
                    && matches!(arg2.expr_kind(), ExprKind::Lit(Literal::String(_))) =>
            {
                let tag = match arg2.expr_kind() {
                    ExprKind::Lit(Literal::String(s)) => Some(s.clone()),
                    _ => None,
                };
                self.path(e, arg1, Vec::new(), tag, *op == BinaryOp::GetTag);
            }
            ExprKind::If {
                test_expr,
                then_expr,
                else_expr,
            } => {
                self.expr(test_expr);
                self.expr(then_expr);
                self.expr(else_expr);
            }
            ExprKind::And { left, right } | ExprKind::Or { left, right } => {
                self.expr(left);
                self.expr(right);
            }
            ExprKind::BinaryApp { arg1, arg2, .. } => {
                self.expr(arg1);
                self.expr(arg2);
            }
            ExprKind::UnaryApp { arg, .. }
            | ExprKind::Like { expr: arg, .. }
            | ExprKind::Is { expr: arg, .. } => self.expr(arg),
            ExprKind::ExtensionFunctionApp { args, .. } | ExprKind::Set(args) => {
                for a in args.iter() {
                    self.expr(a);
                }
            }
            ExprKind::Record(fields) => {
                for v in fields.values() {
                    self.expr(v);
                }
            }
            // Other literals, variables alone, slots and unknowns read no attribute.
            _ => {}
        }
    }

    /// Records the path `base.attrs...[.getTag(tag)]` (`whole` is the expression that reads
    /// it, for its line), following `base` down through attribute reads to its root.
    fn path(
        &mut self,
        whole: &Expr,
        base: &Expr,
        mut attrs: Vec<SmolStr>,
        tag: Option<SmolStr>,
        read: bool,
    ) {
        let mut at = base;
        while let ExprKind::GetAttr { expr, attr } = at.expr_kind() {
            attrs.insert(0, attr.clone());
            at = expr;
        }
        let root = match at.expr_kind() {
            ExprKind::Var(v) => Root::Var(*v),
            ExprKind::Lit(Literal::EntityUID(uid)) => Root::Entity(uid),
            _ => Root::Expr(at),
        };
        let (root_text, root_kind) = match &root {
            Root::Var(v) => (v.to_string(), "variable"),
            Root::Entity(uid) => (uid.to_string(), "entity"),
            Root::Expr(x) => (format!("({x})"), "expression"),
        };
        let root_entity = match &root {
            Root::Entity(uid) => Some(EntityRef {
                type_name: uid.entity_type().to_string(),
                id: AsRef::<str>::as_ref(uid.eid()).to_owned(),
            }),
            _ => None,
        };
        let mut path = root_text.clone();
        for a in &attrs {
            push_attr(&mut path, a);
        }
        if let Some(t) = &tag {
            path.push_str(&format!(".getTag({})", quote(t)));
        }
        let line = whole.source_loc().map(|l| self.lines.line_col(l.start()).0);
        match self.reads.iter_mut().find(|r| r.path == path) {
            Some(r) => {
                r.read |= read;
                r.has |= !read;
                r.lines.extend(line);
            }
            None => self.reads.push(Read {
                path,
                root: root_text,
                root_kind,
                root_entity,
                attrs,
                tag,
                read,
                has: !read,
                lines: line.into_iter().collect(),
            }),
        }
        match root {
            Root::Entity(uid) => self.entity(uid.to_string()),
            Root::Expr(x) => self.expr(x),
            Root::Var(_) => {}
        }
    }
}

/// Cedar's words that cannot follow a `.` (the language reference's reserved identifiers).
const RESERVED: [&str; 10] = [
    "true", "false", "if", "then", "else", "in", "is", "like", "has", "__cedar",
];

/// Appends `.attr`, or `["attr"]` when `attr` is not an identifier Cedar accepts after a dot.
fn push_attr(path: &mut String, attr: &str) {
    let mut chars = attr.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !RESERVED.contains(&attr);
    if ident {
        path.push('.');
        path.push_str(attr);
    } else {
        path.push('[');
        path.push_str(&quote(attr));
        path.push(']');
    }
}

/// A Cedar string literal of `s`.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.escape_debug())
}

/// Byte offsets to 1-based lines and columns (columns count characters).
struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { text, starts }
    }

    fn line_col(&self, offset: usize) -> (u32, u32) {
        let offset = offset.min(self.text.len());
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts.get(line - 1).copied().unwrap_or(0);
        let col = self
            .text
            .get(start..offset)
            .map_or(0, |s| s.chars().count());
        (
            u32::try_from(line).unwrap_or(u32::MAX),
            u32::try_from(col + 1).unwrap_or(u32::MAX),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]
    use super::*;

    fn one(text: &str) -> PolicyOutline {
        let mut all = outline("p.cedar", text, 0).unwrap();
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    fn paths(p: &PolicyOutline) -> Vec<(&str, bool, bool)> {
        p.reads
            .iter()
            .map(|r| (r.path.as_str(), r.read, r.has))
            .collect()
    }

    const FILE: &str = r#"// the team's rules
@id("owners-read")
permit (
  principal in Group::"staff",
  action in [Action::"read", Action::"view"],
  resource is Document
)
when {
  resource.owner.manager == principal &&
  principal has department && principal.department == "Finance" &&
  context.risk_score < 50
};

forbid (principal, action == Action::"write", resource)
unless { principal.active };

// a template, with no name
@challenge("approval") permit (principal == ?principal, action, resource in ?resource);
"#;

    #[test]
    fn names_effects_text_and_lines() {
        let all = outline("p.cedar", FILE, 0).unwrap();
        let names: Vec<_> = all.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["owners-read", "policy1", "policy2"]);
        let p = &all[0];
        assert_eq!(p.effect, "permit");
        assert!(p.text.starts_with("@id(\"owners-read\")\npermit ("));
        assert!(p.text.ends_with("context.risk_score < 50\n};"));
        assert_eq!((p.start_line, p.end_line), (2, 12));
        assert_eq!(
            (all[1].effect, all[1].start_line, all[1].end_line),
            ("forbid", 14, 15)
        );
        assert_eq!(
            all[1].text,
            "forbid (principal, action == Action::\"write\", resource)\nunless { principal.active };"
        );
        assert!(all[2].template && !all[0].template);
        assert_eq!((all[2].start_line, all[2].end_line), (18, 18));
        // Numbering runs on from the bundle's earlier files.
        let later = outline("q.cedar", FILE, 5).unwrap();
        assert_eq!(later[1].name, "policy6");
    }

    #[test]
    fn reads_are_whole_paths_with_lines() {
        let all = outline("p.cedar", FILE, 0).unwrap();
        let p = &all[0];
        assert_eq!(
            paths(p),
            [
                ("resource.owner.manager", true, false),
                ("principal.department", true, true),
                ("context.risk_score", true, false),
            ]
        );
        assert_eq!(p.reads[0].root, "resource");
        assert_eq!(p.reads[0].root_kind, "variable");
        assert_eq!(p.reads[0].attrs, ["owner", "manager"]);
        assert_eq!(p.reads[0].lines, [9]);
        assert_eq!(p.reads[1].lines, [10]);
        assert_eq!(p.reads[2].lines, [11]);
        assert_eq!(
            p.entities,
            ["Group::\"staff\"", "Action::\"read\"", "Action::\"view\""]
        );
        assert_eq!(paths(&all[1]), [("principal.active", true, false)]);
        assert_eq!(all[1].entities, ["Action::\"write\""]);
        assert!(all[2].reads.is_empty() && all[2].entities.is_empty());
    }

    #[test]
    fn scope_constraints() {
        let all = outline("p.cedar", FILE, 0).unwrap();
        let s = &all[0].scope;
        assert_eq!(
            (s.principal.op, s.principal.entities.as_slice()),
            ("in", &["Group::\"staff\"".to_owned()][..])
        );
        assert_eq!(s.action.op, "in");
        assert_eq!(s.action.entities.len(), 2);
        assert_eq!(
            (s.resource.op, s.resource.entity_type.as_deref()),
            ("is", Some("Document"))
        );
        let t = &all[2].scope;
        assert_eq!(
            (t.principal.op, t.principal.slot.as_deref()),
            ("==", Some("?principal"))
        );
        assert_eq!((t.action.op, t.resource.op), ("any", "in"));
        assert_eq!(t.resource.slot.as_deref(), Some("?resource"));
        let p = one(r#"permit (principal is Human in Group::"a", action, resource == Doc::"x");"#);
        assert_eq!(p.scope.principal.op, "is in");
        assert_eq!(p.scope.principal.entity_type.as_deref(), Some("Human"));
        assert_eq!(p.scope.resource.entities, ["Doc::\"x\""]);
        assert_eq!(p.entities, ["Group::\"a\"", "Doc::\"x\""]);
    }

    #[test]
    fn has_chains_literals_tags_and_other_roots() {
        let p = one(r#"permit (principal, action, resource) when {
  context has a.b.c &&
  Group::"admins".lead == principal &&
  resource.hasTag("owner") && resource.getTag("owner") == principal.id &&
  (if context.flag then principal else resource).owner.team == "x" &&
  principal["first name"] like "A*" &&
  principal.tags.contains(User::"root") && ip(context.addr).isLoopback() &&
  {a: principal.x}.a == 1
};"#);
        assert_eq!(
            paths(&p),
            [
                ("context.a.b.c", false, true),
                ("Group::\"admins\".lead", true, false),
                ("resource.getTag(\"owner\")", true, true),
                ("principal.id", true, false),
                (
                    "(if context.flag then principal else resource).owner.team",
                    true,
                    false
                ),
                ("context.flag", true, false),
                ("principal[\"first name\"]", true, false),
                ("principal.tags", true, false),
                ("context.addr", true, false),
                ("({a: principal.x}).a", true, false),
                ("principal.x", true, false),
            ]
        );
        let lit = &p.reads[1];
        assert_eq!(
            (lit.root.as_str(), lit.root_kind),
            ("Group::\"admins\"", "entity")
        );
        let r = lit.root_entity.as_ref().unwrap();
        assert_eq!((r.type_name.as_str(), r.id.as_str()), ("Group", "admins"));
        assert!(p.reads[0].root_entity.is_none());
        assert_eq!(p.reads[2].tag.as_deref(), Some("owner"));
        assert_eq!(p.reads[4].root_kind, "expression");
        assert_eq!(p.reads[4].lines, [5]);
        assert_eq!(p.entities, ["Group::\"admins\"", "User::\"root\""]);
    }

    #[test]
    fn unnamed_statements_and_an_empty_file() {
        assert!(outline("e.cedar", "// nothing\n", 0)
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty());
        let p = one("permit(principal,action,resource);");
        assert_eq!(
            (p.name.as_str(), p.start_line, p.end_line),
            ("policy0", 1, 1)
        );
        assert_eq!(p.text, "permit(principal,action,resource);");
    }

    #[test]
    fn a_syntax_error_has_its_line_and_column() {
        let text = "@id(\"a\")\npermit (principal, action, resource)\nwhen { principal.x == };\n";
        let err = outline("bad.cedar", text, 0)
            .err()
            .unwrap_or_else(|| panic!("parsed"));
        let first = err.errors.first().unwrap_or_else(|| panic!("no error"));
        assert_eq!(first.file, "bad.cedar");
        assert_eq!((first.line, first.column), (Some(3), Some(23)));
        assert!(
            first.message.contains("unexpected token"),
            "{}",
            first.message
        );
    }
}
