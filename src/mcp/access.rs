//! Who is calling, and what they may touch: the [`Caller`] of one MCP
//! request, its repositories ([`RepoScope`]) and the [`JobOwner`] its jobs
//! get.
//!
//! The HTTP guard ([`super::http_guard`]) works out the caller from the
//! bearer token and puts it in the request's extensions; a tool reads it
//! back through [`Caller::of`]. A stdio client is the operator who
//! started the server: it may use every repository. This module decides
//! nothing on its own: the tools and the service ask it before they read a
//! repository, an artifact or a job, and answer a caller that may not see
//! something exactly as if it did not exist.

use super::service::ServiceError;
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use std::collections::BTreeSet;

/// The principal of a stdio client (the operator's own process).
pub const LOCAL: &str = "stdio";
/// The principal of a token given with `--token-file`, `CONFINE_TOKEN`, or
/// generated at start: the operator's, for every repository.
pub const DEFAULT_TOKEN: &str = "default";
/// The principal of requests to a server started with `--no-token`.
pub const ANONYMOUS: &str = "anonymous";

/// The repositories a caller may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoScope {
    All,
    Only(BTreeSet<String>),
}

impl RepoScope {
    /// From a configured list: `["*"]` is every repository.
    pub fn from_list(repos: &[String]) -> RepoScope {
        if repos.iter().any(|r| r == "*") {
            RepoScope::All
        } else {
            RepoScope::Only(repos.iter().cloned().collect())
        }
    }

    pub fn allows(&self, repo_id: &str) -> bool {
        match self {
            RepoScope::All => true,
            RepoScope::Only(ids) => ids.contains(repo_id),
        }
    }
}

/// Whom a job belongs to: the principal that started it and, over HTTP,
/// its MCP session (`None`: stdio, or a stateless HTTP request, whose jobs
/// belong to every stateless request of the same principal).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobOwner {
    pub principal: String,
    pub session: Option<String>,
}

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `stdio`, `default`, `anonymous`, or `token:<id>` of `[[mcp.tokens]]`.
    pub principal: String,
    /// The `Mcp-Session-Id` the request came with.
    pub session: Option<String>,
    pub repos: RepoScope,
}

impl Caller {
    /// A stdio client, or an in-process one: the operator, every repository.
    pub fn local() -> Caller {
        Caller { principal: LOCAL.into(), session: None, repos: RepoScope::All }
    }

    /// The caller of a tool call. Over HTTP it is what the guard found for
    /// the request's token, with the request's session; a request over HTTP
    /// without one is refused (the guard always sets it: its absence is a
    /// bug, and must not mean "the operator"). Without HTTP parts, the
    /// transport is stdio (or in memory) and the caller is [`Caller::local`].
    pub fn of(ctx: &RequestContext<RoleServer>, over_http: bool) -> Result<Caller, ServiceError> {
        let Some(parts) = ctx.extensions.get::<axum::http::request::Parts>() else {
            return if over_http {
                Err(ServiceError::Denied("the request carried no credentials".into()))
            } else {
                Ok(Caller::local())
            };
        };
        let Some(caller) = parts.extensions.get::<Caller>() else {
            return Err(ServiceError::Denied("the request carried no credentials".into()));
        };
        let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        Ok(Caller { session, ..caller.clone() })
    }

    /// The owner of the jobs this caller starts.
    pub fn owner(&self) -> JobOwner {
        JobOwner { principal: self.principal.clone(), session: self.session.clone() }
    }

    /// Whether this caller may see a job of `owner`.
    pub fn owns(&self, owner: &JobOwner) -> bool {
        *owner == self.owner()
    }

    /// Whether this caller may use repository `repo_id`.
    pub fn may_use(&self, repo_id: &str) -> bool {
        self.repos.allows(repo_id)
    }

    /// A request naming `repo_id`: refused when this caller may not use it,
    /// with the same words whether or not such a repository exists.
    pub fn check_repo(&self, repo_id: &str) -> Result<(), ServiceError> {
        if self.may_use(repo_id) {
            return Ok(());
        }
        let allowed = match &self.repos {
            RepoScope::Only(ids) if !ids.is_empty() => ids.iter().cloned().collect::<Vec<_>>().join(", "),
            _ => "none".into(),
        };
        Err(ServiceError::Denied(format!(
            "repository '{}' is not available to this token (it may use: {allowed}); ask the operator to add it \
             to the token's repos in confine.toml",
            clip(repo_id)
        )))
    }
}

fn clip(s: &str) -> String {
    s.chars().take(60).map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_caller_sees_only_its_repositories_and_its_own_jobs() {
        let a = Caller {
            principal: "token:ci".into(),
            session: Some("s1".into()),
            repos: RepoScope::from_list(&["web".into()]),
        };
        assert!(a.may_use("web") && !a.may_use("api"));
        let e = a.check_repo("api").unwrap_err();
        assert_eq!(e.status(), "denied");
        assert!(e.message().starts_with("repository 'api' is not available to this token (it may use: web)"), "{e}");
        assert!(RepoScope::from_list(&["*".into()]).allows("anything"));
        let other_session = Caller { session: Some("s2".into()), ..a.clone() };
        assert!(a.owns(&a.owner()) && !other_session.owns(&a.owner()));
        let other_token = Caller { principal: "token:x".into(), ..a.clone() };
        assert!(!other_token.owns(&a.owner()), "a session id is not enough: the token must match");
        assert!(Caller::local().may_use("api"));
    }
}
