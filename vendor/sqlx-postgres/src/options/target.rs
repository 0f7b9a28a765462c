//! libpq's host list and `target_session_attrs` (not in sqlx 0.9.0: sqlx#3333, sqlx#2290).
//!
//! `postgres://u@h1:5433,h2:5434/db?target_session_attrs=read-write`: a URL parser takes
//! one host only, so the list is taken out of the authority before the URL is parsed.
use crate::error::Error;
use std::fmt;
use std::str::FromStr;

/// Which server a new connection is kept on (libpq's `target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PgTargetSessionAttrs {
    /// The first host that connects.
    #[default]
    Any,
    /// A server whose sessions accept writes: `SHOW transaction_read_only` is `off`.
    ReadWrite,
    /// A server that is not in recovery: `pg_is_in_recovery()` is false.
    Primary,
}

impl PgTargetSessionAttrs {
    pub fn as_str(self) -> &'static str {
        match self {
            PgTargetSessionAttrs::Any => "any",
            PgTargetSessionAttrs::ReadWrite => "read-write",
            PgTargetSessionAttrs::Primary => "primary",
        }
    }
}

impl fmt::Display for PgTargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PgTargetSessionAttrs {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "any" => Ok(PgTargetSessionAttrs::Any),
            "read-write" => Ok(PgTargetSessionAttrs::ReadWrite),
            "primary" => Ok(PgTargetSessionAttrs::Primary),
            other => Err(Error::Configuration(
                format!(
                    "target_session_attrs {other:?} is not one of any, read-write, primary \
                     (read-only, standby and prefer-standby are not supported)"
                )
                .into(),
            )),
        }
    }
}

/// One host of a host list and its port, when it names one.
pub(crate) type ListedHost = (String, Option<u16>);

/// A URL whose authority lists several hosts, split: the URL with the first host alone
/// (for the URL parser) and every host in order. `None` when the URL names one host: it
/// is parsed as before.
pub(crate) fn split_host_list(url: &str) -> Result<Option<(String, Vec<ListedHost>)>, Error> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return Ok(None);
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let hosts_start = authority.rfind('@').map_or(0, |at| at + 1);
    let list = &authority[hosts_start..];
    if !list.contains(',') {
        return Ok(None);
    }
    let hosts = list
        .split(',')
        .enumerate()
        .map(|(i, entry)| parse_host(i + 1, entry))
        .collect::<Result<Vec<_>, _>>()?;
    let first = list.split(',').next().unwrap_or_default();
    let single = format!(
        "{}{}{}{}",
        &url[..scheme_end],
        &authority[..hosts_start],
        first,
        &rest[authority_end..]
    );
    Ok(Some((single, hosts)))
}

/// `host`, `host:port` or `[v6]:port`, the `n`th of the list.
fn parse_host(n: usize, entry: &str) -> Result<ListedHost, Error> {
    let bad = |what: String| Error::Configuration(format!("host list: {what}").into());
    let (host, port) = if let Some(bracketed) = entry.strip_prefix('[') {
        let Some((v6, after)) = bracketed.split_once(']') else {
            return Err(bad(format!("host {n} ({entry:?}) has no closing ']'")));
        };
        match after {
            "" => (format!("[{v6}]"), None),
            _ => match after.strip_prefix(':') {
                Some(port) => (format!("[{v6}]"), Some(port)),
                None => return Err(bad(format!("host {n} ({entry:?}) is not [address]:port"))),
            },
        }
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (entry.to_owned(), None),
        }
    };
    if host.is_empty() {
        return Err(bad(format!("host {n} is empty")));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 => Some(p),
            _ => {
                return Err(bad(format!(
                    "host {n} ({host}) has the port {port:?}, not a port number (1-65535)"
                )))
            }
        },
    };
    Ok((host, port))
}
