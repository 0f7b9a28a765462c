//! Who is calling: API keys, the setting that says when one is needed, and the check
//! that turns a request's `Authorization: Bearer …` into a [`Caller`].
//!
//! A key is `ck_` and 64 hex digits: 32 random bytes from the operating system. The
//! database keeps only its SHA-256 (see [`KeyHash`]), so a copy of the database lets no
//! one call the service. Keys live in the database, not in one process, and every request
//! is checked against it: a key created or revoked by `checkout api-keys` on any machine
//! counts from the next request on every instance.

pub mod api_keys;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::PaymentSettings;
use crate::db::{Database, StoreError};
use crate::payments::{Currency, Money, PerCurrency};
use crate::worker::{Worker, every};

/// Who is calling, and what it may do. The API key check inserts one into every request's
/// extensions on the callers' routes: the key's caller, or [`Caller::open`] while the
/// service needs no key. Idempotency-Keys are scoped to its name: two callers may use the
/// same key without meeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The key's name; `""` for the anonymous caller of open mode.
    pub name: String,
    pub scopes: Scopes,
    /// The key's own approval thresholds (`--approval-above`); where it names no amount
    /// for a currency, `CHECKOUT_APPROVAL_ABOVE` decides.
    pub approval_above: Option<PerCurrency>,
    /// The key's own daily budget (`--budget-per-day`); where it names no amount for a
    /// currency, `CHECKOUT_BUDGET_PER_DAY` decides.
    pub budget_per_day: Option<PerCurrency>,
}

impl Caller {
    /// The anonymous caller `""` of open mode (no key needed): every scope, no limits of
    /// its own (the settings' still apply).
    pub fn open() -> Caller {
        Caller {
            name: String::new(),
            scopes: Scopes::ALL,
            approval_above: None,
            budget_per_day: None,
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.has(scope)
    }

    /// Above what amount of `currency` a charge of this caller's waits for a person: the
    /// key's own, else the setting's; `None`: never.
    pub fn approval_above(&self, settings: &PaymentSettings, currency: Currency) -> Option<Money> {
        own_or_setting(
            self.approval_above.as_ref(),
            &settings.approval_above,
            currency,
        )
    }

    /// What this caller may be charged in `currency` per UTC day: the key's own, else the
    /// setting's; `None`: no budget.
    pub fn budget_per_day(&self, settings: &PaymentSettings, currency: Currency) -> Option<Money> {
        own_or_setting(
            self.budget_per_day.as_ref(),
            &settings.budget_per_day,
            currency,
        )
    }
}

fn own_or_setting(
    own: Option<&PerCurrency>,
    setting: &PerCurrency,
    currency: Currency,
) -> Option<Money> {
    own.and_then(|own| own.get(currency))
        .or_else(|| setting.get(currency))
}

/// What an API key lets its caller do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// POST /checkout, and its own operations and receipts.
    Checkout,
    /// POST /refunds.
    Refund,
    /// The approvals endpoints: approve and deny.
    Approve,
    /// Every caller's receipts and operations.
    Read,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Checkout, Scope::Refund, Scope::Approve, Scope::Read];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Checkout => "checkout",
            Scope::Refund => "refund",
            Scope::Approve => "approve",
            Scope::Read => "read",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes, written as a comma list (`checkout,read`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = Scopes(0b1111);
    /// What a new key gets unless told otherwise.
    pub const DEFAULT: Scopes = Scopes(1 << Scope::Checkout as u8);

    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub fn has(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Reads `checkout,refund`: at least one scope, each one of checkout, refund, approve,
    /// read.
    pub fn parse(text: &str) -> Result<Scopes, String> {
        let mut bits = 0;
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let scope = Scope::ALL
                .into_iter()
                .find(|s| s.as_str() == word)
                .ok_or_else(|| {
                    format!(
                        "{word:?} is not a scope: the scopes are checkout, refund, approve, read"
                    )
                })?;
            bits |= scope.bit();
        }
        if bits == 0 {
            return Err("name at least one scope: checkout, refund, approve, read".into());
        }
        Ok(Scopes(bits))
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for scope in Scope::ALL.into_iter().filter(|s| self.has(*s)) {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            f.write_str(scope.as_str())?;
        }
        Ok(())
    }
}

/// What a new key may do: its scopes and its own limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySpec {
    pub scopes: Scopes,
    pub approval_above: Option<PerCurrency>,
    pub budget_per_day: Option<PerCurrency>,
}

impl KeySpec {
    /// The scope `checkout`, no limits of its own: `checkout api-keys create NAME`.
    pub fn checkout() -> KeySpec {
        KeySpec {
            scopes: Scopes::DEFAULT,
            ..KeySpec::default()
        }
    }
}

/// `CHECKOUT_AUTH`: when a caller must send an API key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Open while no API key exists (a revoked one counts) and only on a loopback
    /// address; keys required once one exists.
    Auto,
    /// A valid key on every request, even while none exists.
    Required,
    /// Open on any address: no key is asked for or read.
    Off,
}

impl AuthMode {
    pub fn parse(v: &str) -> Result<AuthMode, String> {
        match v {
            "auto" => Ok(AuthMode::Auto),
            "required" => Ok(AuthMode::Required),
            "off" => Ok(AuthMode::Off),
            _ => Err(format!("{v:?} is none of auto, required, off")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Auto => "auto",
            AuthMode::Required => "required",
            AuthMode::Off => "off",
        }
    }
}

/// A new API key, as shown once to whoever made it.
pub struct NewKey {
    pub name: String,
    pub key: String,
}

/// The SHA-256 of a key, in lowercase hex: what the database keeps and looks keys up by.
///
/// A fast hash is enough here, unlike for passwords: a key carries 256 random bits, so
/// no one can guess one from its hash, however many hashes a second they try; a slow hash
/// (argon2, bcrypt) would only make every request slower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyHash(String);

impl KeyHash {
    pub fn of(key: &str) -> KeyHash {
        let digest = Sha256::digest(key.as_bytes());
        KeyHash(hex::encode(digest))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Equal in time that does not depend on where the two differ.
    fn matches(&self, stored: &str) -> bool {
        self.0.as_bytes().ct_eq(stored.as_bytes()).into()
    }
}

pub const KEY_PREFIX: &str = "ck_";

/// A fresh key: `ck_` and 32 random bytes in hex.
pub fn generate_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{KEY_PREFIX}{}", hex::encode(bytes)))
}

/// A key name: 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
pub fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a key name: 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
        ))
    }
}

/// Why `api-keys create` or `revoke` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    InvalidName(String),
    /// Scopes or limits that do not parse, or no scope at all.
    #[error("{0}")]
    InvalidSpec(String),
    #[error(
        "an API key named {0:?} exists already (revoked or not; a name is never reused, so that no new caller inherits an old one's Idempotency-Keys)"
    )]
    NameTaken(String),
    #[error("no API key is named {0:?}")]
    NoSuchName(String),
    #[error("the API key {0:?} is revoked already")]
    AlreadyRevoked(String),
    #[error("no randomness from the operating system: {0}")]
    Random(getrandom::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Makes a key named `name` with the scope `checkout` and no limits of its own.
pub async fn create(db: &Database, name: &str) -> Result<NewKey, KeyError> {
    create_with(db, name, &KeySpec::checkout()).await
}

/// Makes a key named `name` that may do what `spec` says, keeps its hash, and returns the
/// key (shown only this once).
pub async fn create_with(db: &Database, name: &str, spec: &KeySpec) -> Result<NewKey, KeyError> {
    valid_name(name).map_err(KeyError::InvalidName)?;
    if spec.scopes == Scopes::default() {
        return Err(KeyError::InvalidSpec(
            "a key needs at least one scope: checkout, refund, approve, read".into(),
        ));
    }
    let key = generate_key().map_err(KeyError::Random)?;
    let mut conn = db.acquire().await?;
    if !api_keys::insert(conn.conn(), name, KeyHash::of(&key).as_str(), spec).await? {
        return Err(KeyError::NameTaken(name.to_owned()));
    }
    Ok(NewKey {
        name: name.to_owned(),
        key,
    })
}

/// Revokes the key named `name`: from the next request on, on every instance, it is
/// refused.
pub async fn revoke(db: &Database, name: &str) -> Result<(), KeyError> {
    let mut conn = db.acquire().await?;
    if api_keys::revoke(conn.conn(), name).await? {
        return Ok(());
    }
    match api_keys::list(conn.conn())
        .await?
        .into_iter()
        .find(|k| k.name == name)
    {
        Some(_) => Err(KeyError::AlreadyRevoked(name.to_owned())),
        None => Err(KeyError::NoSuchName(name.to_owned())),
    }
}

/// The caller named `name` as its key says now, for work resumed without its request
/// (the recovery sweep): `""` is the anonymous caller of open mode; a name no key has
/// keeps no scopes and no limits of its own (the settings' still apply).
pub async fn named(db: &Database, name: &str) -> Result<Caller, StoreError> {
    if name.is_empty() {
        return Ok(Caller::open());
    }
    let mut conn = db.acquire().await?;
    match api_keys::by_name(conn.conn(), name).await? {
        Some(found) => found.into_caller(),
        None => Ok(Caller {
            name: name.to_owned(),
            scopes: Scopes::default(),
            approval_above: None,
            budget_per_day: None,
        }),
    }
}

/// Whether any API key was ever made (a revoked one counts).
pub async fn keys_exist(db: &Database) -> Result<bool, StoreError> {
    let mut conn = db.acquire().await?;
    api_keys::any(conn.conn()).await
}

/// Every key, oldest first: names and times, never a key.
pub async fn list(db: &Database) -> Result<Vec<api_keys::Listed>, StoreError> {
    let mut conn = db.acquire().await?;
    api_keys::list(conn.conn()).await
}

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
        Ok(match api_keys::find(conn.conn(), hash.as_str()).await? {
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
    fn a_key_is_the_prefix_and_64_hex_digits_and_never_repeats() {
        let a = generate_key().unwrap();
        let b = generate_key().unwrap();
        assert_eq!(a.len(), 3 + 64);
        assert!(a.starts_with("ck_"));
        assert!(a[3..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_hash_is_the_sha256_in_hex() {
        // echo -n abc | sha256sum
        assert_eq!(
            KeyHash::of("abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(KeyHash::of("abc").matches(KeyHash::of("abc").as_str()));
        assert!(!KeyHash::of("abc").matches(KeyHash::of("abd").as_str()));
    }

    #[test]
    fn only_bearer_with_one_key_is_read() {
        assert_eq!(bearer(b"Bearer ck_1"), Some("ck_1"));
        assert_eq!(bearer(b"bearer ck_1"), Some("ck_1"));
        assert_eq!(bearer(b"Basic dXNlcjpwYXNz"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearer a b"), None);
        assert_eq!(bearer(b"ck_1"), None);
    }

    #[test]
    fn scopes_read_what_they_write_and_refuse_the_rest() {
        let scopes = Scopes::parse("read, checkout").unwrap();
        assert_eq!(scopes.to_string(), "checkout,read");
        assert!(scopes.has(Scope::Read) && !scopes.has(Scope::Approve));
        assert_eq!(Scopes::ALL.to_string(), "checkout,refund,approve,read");
        assert_eq!(Scopes::DEFAULT.to_string(), "checkout");
        assert!(Scopes::parse("").is_err());
        assert!(Scopes::parse("checkout,admin").is_err());
    }

    #[test]
    fn a_key_s_own_limit_comes_before_the_setting() {
        let usd = Currency::parse("USD").unwrap();
        let eur = Currency::parse("EUR").unwrap();
        let mut settings = crate::config::Settings::default().payments;
        settings.budget_per_day = PerCurrency::parse("USD:100.00,EUR:90.00").unwrap();
        let mut caller = Caller::open();
        assert_eq!(
            caller.budget_per_day(&settings, usd).unwrap().minor(),
            10_000
        );
        caller.budget_per_day = Some(PerCurrency::parse("USD:5.00").unwrap());
        assert_eq!(caller.budget_per_day(&settings, usd).unwrap().minor(), 500);
        assert_eq!(
            caller.budget_per_day(&settings, eur).unwrap().minor(),
            9_000
        );
        assert!(caller.approval_above(&settings, usd).is_none());
        assert!(Caller::open().has(Scope::Approve));
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("shop-1.eu_west").is_ok());
        assert!(valid_name("").is_err());
        assert!(valid_name("-x").is_err());
        assert!(valid_name("a b").is_err());
        assert!(valid_name(&"a".repeat(65)).is_err());
    }
}
