//! `DATABASE_URL` read as the drivers will read it, so that a URL they would refuse stops
//! the service at start-up (exit 2, naming the setting) rather than at its first
//! connection. Postgres takes libpq's host list and `target_session_attrs`
//! (`postgres://u@h1:5433,h2:5434/db?target_session_attrs=read-write`, and
//! `PGTARGETSESSIONATTRS`): the patched sqlx-postgres of vendor/ reads them, and each new
//! connection walks the hosts in order and keeps the first that matches.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

/// Whether the driver can use `url`; what is wrong with it, if not.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        PgConnectOptions::from_str(url)
            .map(drop)
            .map_err(|err| err.to_string())
    } else {
        Ok(())
    }
}

/// The most time one host of a list gets by default ([`with_host_timeout`]).
const MAX_HOST_TIMEOUT: Duration = Duration::from_secs(5);

/// The options with a connect timeout per host when the URL lists several hosts and
/// neither it (`connect_timeout`) nor `PGCONNECT_TIMEOUT` gives one: an equal share of the
/// pool's acquire timeout, at most 5 s. libpq waits for a host as long as TCP does, and a
/// host that went away without refusing (a machine down, a dropped route) then holds every
/// new connection until the acquire timeout, which ends the walk before it reaches the next
/// host. A share makes the walk reach the last host within the time a request waits for a
/// connection. One host has no walk: its URL connects as it always did, within the
/// acquire timeout.
pub(super) fn with_host_timeout(
    options: PgConnectOptions,
    url: &str,
    acquire: Duration,
) -> PgConnectOptions {
    let hosts = options.get_hosts().len();
    if hosts < 2 || says_connect_timeout(url) || std::env::var_os("PGCONNECT_TIMEOUT").is_some() {
        return options;
    }
    let share = acquire / u32::try_from(hosts).unwrap_or(u32::MAX);
    options.connect_timeout(share.min(MAX_HOST_TIMEOUT))
}

/// Whether the URL's parameters name `connect_timeout` (`0` included: wait as TCP does).
fn says_connect_timeout(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.split('=').next() == Some("connect_timeout"))
    })
}

/// The hosts a new connection walks and the server it keeps, for the start-up line:
/// `127.0.0.1:5433, 127.0.0.1:5434 (the first read-write one), each within 1000 ms`.
pub(super) fn describe(options: &PgConnectOptions) -> String {
    let hosts: Vec<String> = options
        .get_hosts()
        .iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect();
    let walk = match options.get_target_session_attrs().as_str() {
        "any" => hosts.join(", "),
        attrs => format!("{} (the first {attrs} one)", hosts.join(", ")),
    };
    match options.get_connect_timeout() {
        Some(limit) => format!("{walk}, each within {} ms", limit.as_millis()),
        None => walk,
    }
}

#[cfg(test)]
mod tests {
    use sqlx::postgres::PgTargetSessionAttrs;

    use super::*;

    fn options(url: &str) -> PgConnectOptions {
        PgConnectOptions::from_str(url).unwrap_or_else(|err| panic!("{url}: {err}"))
    }

    fn hosts(url: &str) -> Vec<(String, u16)> {
        options(url)
            .get_hosts()
            .into_iter()
            .map(|(h, p)| (h.to_owned(), p))
            .collect()
    }

    fn owned(list: &[(&str, u16)]) -> Vec<(String, u16)> {
        list.iter().map(|(h, p)| (h.to_string(), *p)).collect()
    }

    // Seen failing: with the host list's split taken out of vendor/sqlx-postgres, "error
    // with configuration: invalid port number".
    #[test]
    fn a_host_list_is_walked_in_the_order_written_with_its_target() {
        let url = "postgres://u:p@127.0.0.1:5433,db2:5434,[::1]:5435,db4/checkout?target_session_attrs=read-write&sslmode=disable";
        assert_eq!(
            hosts(url),
            owned(&[
                ("127.0.0.1", 5433),
                ("db2", 5434),
                ("[::1]", 5435),
                ("db4", 5432)
            ])
        );
        let o = options(url);
        assert_eq!(
            o.get_target_session_attrs(),
            PgTargetSessionAttrs::ReadWrite
        );
        assert_eq!(o.get_database(), Some("checkout"));
        assert_eq!(o.get_username(), "u");
        assert_eq!((o.get_host(), o.get_port()), ("127.0.0.1", 5433));
        assert_eq!(
            describe(&o),
            "127.0.0.1:5433, db2:5434, [::1]:5435, db4:5432 (the first read-write one)"
        );
        // A host without a port takes the `port` parameter, as libpq's do.
        assert_eq!(
            hosts("postgres://h1,h2:6000/d?port=7000"),
            owned(&[("h1", 7000), ("h2", 6000)])
        );
        assert_eq!(
            options("postgres://h1:1,h2:2/d?target_session_attrs=primary&connect_timeout=3")
                .get_connect_timeout(),
            Some(std::time::Duration::from_secs(3))
        );
    }

    // Seen failing with `with_host_timeout` returning its options unchanged: "left: None,
    // right: Some(1s)" for the first list.
    #[test]
    fn a_host_list_gets_a_share_of_the_acquire_timeout_per_host_unless_the_url_says() {
        let two_seconds = Duration::from_secs(2);
        let timeout = |url: &str, acquire| {
            with_host_timeout(options(url), url, acquire).get_connect_timeout()
        };
        assert_eq!(
            timeout("postgres://h1,h2/d", two_seconds),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            timeout("postgres://h1,h2,h3,h4/d", two_seconds),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            timeout("postgres://h1,h2/d", Duration::from_secs(60)),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            timeout("postgres://h1,h2/d?connect_timeout=3", two_seconds),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            timeout(
                "postgres://h1,h2/d?sslmode=disable&connect_timeout=0",
                two_seconds
            ),
            None
        );
        assert_eq!(timeout("postgres://h1/d", two_seconds), None);
        let o = with_host_timeout(
            options("postgres://h1:1,h2:2/d?target_session_attrs=read-write"),
            "postgres://h1:1,h2:2/d?target_session_attrs=read-write",
            two_seconds,
        );
        assert_eq!(
            describe(&o),
            "h1:1, h2:2 (the first read-write one), each within 1000 ms"
        );
    }

    // Seen failing: with `read-write` the default of vendor/sqlx-postgres's options, the
    // target was ReadWrite (a one-host URL would have been checked on every connect).
    #[test]
    fn a_url_with_one_host_reads_as_before() {
        let o = options("postgres://postgres@127.0.0.1:5432/checkout_test");
        assert_eq!(
            hosts("postgres://postgres@127.0.0.1:5432/checkout_test"),
            owned(&[("127.0.0.1", 5432)])
        );
        assert_eq!(o.get_target_session_attrs(), PgTargetSessionAttrs::Any);
        assert_eq!(o.get_connect_timeout(), None);
        assert_eq!(describe(&o), "127.0.0.1:5432");
    }

    // Seen failing: with the host list's split and the `target_session_attrs` and
    // `connect_timeout` parameters taken out of vendor/sqlx-postgres: "invalid port number"
    // for the first list, without the host.
    #[test]
    fn a_bad_host_list_or_target_is_refused_saying_what_is_wrong() {
        for (url, says) in [
            ("postgres://h1:5433,/db", "host list: host 2 is empty"),
            ("postgres://,h2/db", "host list: host 1 is empty"),
            ("postgres://h1:5433,:5434/db", "host list: host 2 is empty"),
            (
                "postgres://h1:5433,h2:54x/db",
                "host list: host 2 (h2) has the port \"54x\", not a port number (1-65535)",
            ),
            ("postgres://h1:0,h2/db", "host 1 (h1) has the port \"0\""),
            (
                "postgres://h1:70000,h2/db",
                "host 1 (h1) has the port \"70000\"",
            ),
            ("postgres://h1,h2:/db", "host 2 (h2) has the port \"\""),
            (
                "postgres://h1,[::1/db",
                "host 2 (\"[::1\") has no closing ']'",
            ),
            (
                "postgres://h1,h2/db?target_session_attrs=read_write",
                "target_session_attrs \"read_write\" is not one of any, read-write, primary",
            ),
            (
                "postgres://h1/db?target_session_attrs=standby",
                "target_session_attrs \"standby\" is not one of any, read-write, primary",
            ),
            (
                "postgres://h1/db?connect_timeout=soon",
                "connect_timeout \"soon\" is not a number of seconds",
            ),
        ] {
            let err = check_url(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
        assert_eq!(check_url("sqlite://checkout.db"), Ok(()));
    }
}
