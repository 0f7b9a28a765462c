//! The gate: when a request needs an API key (`CHECKOUT_AUTH`), and the check that turns
//! its `Authorization: Bearer …` into a [`Caller`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Caller;
use super::api_keys::{KeyHash, find, keys_exist};
use crate::config::AuthMode;
use crate::db::{Database, StoreError};
use crate::worker::{Worker, every};

/// Asks every [`KEYS_REFRESH`] whether a key exists, until one does. A failed question is
/// logged and asked again; the service stays as it was (open on loopback only, where a
/// checkout needs the same database to charge).
pub struct KeyWatch(Gate);

impl Worker for KeyWatch {
    const NAME: &'static str = "API-key watch";

    async fn run(self) {
        let gate = self.0;
        every(KEYS_REFRESH, || async {
            // Once a key exists, it does for good: nothing is left to ask.
            if gate.keys_exist.load(Ordering::Acquire) {
                return;
            }
            match keys_exist(&gate.db).await {
                Ok(false) => {}
                Ok(true) => {
                    gate.keys_exist.store(true, Ordering::Release);
                    tracing::info!(
                        "callers: an API key exists now: /checkout and /receipts need one from here on (CHECKOUT_AUTH=auto)"
                    );
                }
                Err(err) => tracing::warn!("callers: cannot ask whether an API key exists: {err}"),
            }
        })
        .await
    }
}

/// What a request's credentials come to.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A valid key: the caller it names.
    Caller(Caller),
    /// No key needed (open): the anonymous caller.
    Open,
    /// Refused, and why (for the 401's detail; never the key).
    Refused(AuthRefusal),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// No `Authorization` header, and a key is needed.
    Missing,
    /// An `Authorization` header that is not `Bearer <key>`.
    NotBearer,
    /// A key no one made, or one that was revoked.
    Invalid,
}

/// How often an open service (`auto`, no key yet) asks whether a key exists now.
pub const KEYS_REFRESH: Duration = Duration::from_secs(1);

/// The check each protected request goes through.
#[derive(Clone, Debug)]
pub struct Gate {
    mode: AuthMode,
    /// Whether the service listens on a loopback address only (`auto` may be open then).
    loopback: bool,
    db: Database,
    /// Whether any key exists (a revoked one counts): once true, true for good.
    keys_exist: Arc<AtomicBool>,
}

impl Gate {
    /// `keys_exist`: as read at start-up.
    pub fn new(mode: AuthMode, listen: SocketAddr, db: &Database, keys_exist: bool) -> Gate {
        Gate {
            mode,
            loopback: listen.ip().is_loopback(),
            db: db.clone(),
            keys_exist: Arc::new(AtomicBool::new(keys_exist)),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Whether the service is open now: `off`, or `auto` on loopback while no key exists.
    pub fn is_open(&self) -> bool {
        match self.mode {
            AuthMode::Off => true,
            AuthMode::Required => false,
            AuthMode::Auto => self.loopback && !self.keys_exist.load(Ordering::Acquire),
        }
    }

    /// The worker that closes the service once a key exists, while it is open under
    /// `auto`; `None` when keys are not what opens it.
    pub fn key_watch(&self) -> Option<KeyWatch> {
        (self.mode == AuthMode::Auto && self.is_open()).then(|| KeyWatch(self.clone()))
    }

    /// The verdict on a request's `Authorization` header (its value, if sent) when it
    /// needs no database; else the key sent, for [`Gate::look_up`]. A key that is sent is
    /// always checked, open or not: a wrong key is refused, never ignored.
    pub fn verdict<'a>(&self, authorization: Option<&'a [u8]>) -> Result<Verdict, &'a str> {
        if self.mode == AuthMode::Off {
            return Ok(Verdict::Open);
        }
        let Some(header) = authorization else {
            return Ok(if self.is_open() {
                Verdict::Open
            } else {
                Verdict::Refused(AuthRefusal::Missing)
            });
        };
        match bearer(header) {
            Some(key) => Err(key),
            None => Ok(Verdict::Refused(AuthRefusal::NotBearer)),
        }
    }

    /// The verdict on a key sent, from the database.
    pub async fn look_up(&self, key: &str) -> Result<Verdict, StoreError> {
        let hash = KeyHash::of(key);
        let mut conn = self.db.acquire().await?;
        // The lookup is by the hash of what was sent, so its timing tells nothing about a
        // stored key; the constant-time comparison of the hashes is a second lock.
        Ok(match find(conn.conn(), hash.as_str()).await? {
            Some(found) if found.revoked_at.is_none() && hash.matches(&found.key_hash) => {
                self.keys_exist.store(true, Ordering::Release);
                Verdict::Caller(found.into_caller()?)
            }
            _ => Verdict::Refused(AuthRefusal::Invalid),
        })
    }
}

/// The key of `Bearer <key>` (the scheme's name in any case, RFC 9110 §11.1).
fn bearer(header: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(header).ok()?;
    let (scheme, key) = text.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty() && !key.contains(' ')).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bearer_with_one_key_is_read() {
        assert_eq!(bearer(b"Bearer ck_1"), Some("ck_1"));
        assert_eq!(bearer(b"bearer ck_1"), Some("ck_1"));
        assert_eq!(bearer(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer a b"), None);
        assert_eq!(bearer(b"ck_1"), None);
    }
}
