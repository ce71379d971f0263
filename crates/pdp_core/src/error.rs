//! Typed errors of the decision core.
//!
//! Two kinds, mirroring who is at fault (docs/decisions.md#errors):
//!
//! * [`BundleError`]: a policy bundle (policies, schema, entities, template links) could not be
//!   loaded. It carries *every* problem found, each with the file, line and column it points at,
//!   so an author can fix them all in one pass.
//! * [`RequestError`]: a check request is malformed or does not match the schema. It names the
//!   request field at fault (`principal.type`, `context`, `entities[2]`, ...).
//!
//! Messages follow Cedar's own style guide: lowercase, no final period, user input in backticks.

use serde::Serialize;
use std::fmt;
use thiserror::Error;

/// One problem found while loading a bundle.
///
/// `line` and `column` are 1-based and present whenever the problem points into a text file
/// (policy parse and validation errors, Cedar-syntax schema errors, JSON syntax errors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Error)]
#[error("{}", self.render())]
pub struct SourceError {
    /// File name within the bundle (for example `policies.cedar`), or a pseudo-name such as
    /// `<policies>` when the text was passed in directly.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<u32>,
    /// 1-based column (in characters), when known.
    pub column: Option<u32>,
    /// Policy name the problem belongs to, when it belongs to one.
    pub policy: Option<String>,
    /// What is wrong, in Cedar's message style.
    pub message: String,
}

impl SourceError {
    /// A problem with a file as a whole (no position).
    pub fn file(file: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            line: None,
            column: None,
            policy: None,
            message: message.into(),
        }
    }
}

impl SourceError {
    /// `file[:line[:column]][: policy `name`]: message`, the form compilers use.
    fn render(&self) -> String {
        let mut f = String::new();
        self.write(&mut f).map_or_else(|_| String::new(), |()| f)
    }

    fn write(&self, f: &mut impl fmt::Write) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        if let Some(p) = &self.policy {
            write!(f, ": policy `{p}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A bundle could not be loaded; `errors` lists every problem found (never empty).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}", self.render())]
pub struct BundleError {
    /// Every problem found, in file order.
    pub errors: Vec<SourceError>,
}

impl BundleError {
    /// A bundle error with a single problem.
    pub fn one(err: SourceError) -> Self {
        Self { errors: vec![err] }
    }
}

impl BundleError {
    /// `invalid bundle: N error(s)`, then each problem on its own indented line.
    fn render(&self) -> String {
        let mut f = String::new();
        self.write(&mut f).map_or_else(|_| String::new(), |()| f)
    }

    fn write(&self, f: &mut impl fmt::Write) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "invalid bundle: {n} error{}",
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// A check, plan or store update was rejected because its input is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid `{field}`: {message}")]
pub struct RequestError {
    /// Dotted path of the offending field (`principal`, `context`, `entities[3]`, ...).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl RequestError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Renders an error and its `source()` chain on one line, as Cedar's CLI does.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}
