//! What a notification target may be (pure, no I/O): a webhook URL's syntax, whether the lab's
//! `webhook_hosts` allow its host, and whether a resolved address may be reached. The root
//! engine sends these requests, so a user must not be able to aim them at the machine itself, the
//! cloud metadata service or anything else the lab did not list.

use std::net::{IpAddr, SocketAddr};

/// A webhook URL, split: `https`, host (lower case, no brackets), port, path and query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Parse and check a webhook URL's form: `http(s)://host[:port]/path`, no user info, no fragment.
pub fn url_syntax(url: &str) -> Result<HookUrl, String> {
    if url.len() > 2048 || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("is not a URL (too long, or it has spaces or control characters)".into());
    }
    let uri: hyper::Uri = url.parse().map_err(|e| format!("is not a URL ({e})"))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("is not an http:// or https:// URL".into()),
    };
    let auth = uri.authority().ok_or("has no host")?;
    if auth.as_str().contains('@') {
        return Err(
            "has a user name or password in it (put secrets in the path or query, as Slack's and Mattermost's URLs do)"
                .into(),
        );
    }
    let host = auth
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if host.is_empty() {
        return Err("has no host".into());
    }
    let port = auth.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".into());
    Ok(HookUrl { tls, host, port, path })
}

/// One `webhook_hosts` entry, normalized: `name`, `*.domain`, an IP address, each optionally `:port`
/// (`[v6]:port` for IPv6).
pub fn host_entry(e: &str) -> Result<String, String> {
    let e = e.trim().to_ascii_lowercase();
    let (host, port) = split_port(&e)?;
    let name = host.strip_prefix("*.").unwrap_or(host);
    let ok = host.parse::<IpAddr>().is_ok()
        || (!name.is_empty()
            && name
                .split('.')
                .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')));
    if !ok {
        return Err("it is not a host name or an IP address".into());
    }
    Ok(match port {
        Some(p) if host.contains(':') => format!("[{host}]:{p}"),
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    })
}

fn split_port(e: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = e.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address in brackets lacks its `]`")?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((h, Some(p.parse().map_err(|_| format!("{p:?} is not a port"))?))),
            None if after.is_empty() => Ok((h, None)),
            None => Err("unexpected text after `]`".into()),
        };
    }
    if e.parse::<IpAddr>().is_ok() {
        return Ok((e, None));
    }
    match e.rsplit_once(':') {
        Some((h, p)) => Ok((h, Some(p.parse().map_err(|_| format!("{p:?} is not a port"))?))),
        None => Ok((e, None)),
    }
}

/// Whether the lab lists `host:port` (a user's webhook may go there).
pub fn host_allowed(allowed: &[String], host: &str, port: u16) -> bool {
    allowed.iter().any(|e| {
        let Ok((h, p)) = split_port(e) else { return false };
        if p.is_some_and(|p| p != port) {
            return false;
        }
        match h.strip_prefix("*.") {
            Some(domain) => host.ends_with(&format!(".{domain}")),
            None => h == host,
        }
    })
}

/// Addresses no webhook goes to unless the lab lists the address itself: this machine (loopback,
/// unspecified), link-local (the cloud metadata service at 169.254.169.254), multicast, broadcast.
fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Check each address `host` resolved to: one of [`special`]'s, or any address of this machine
/// (`is_local`: docker0's gateway, the LAN address; each reaches the services listening on 0.0.0.0
/// as loopback does), may only be used when the lab lists that address (or `localhost`, for
/// loopback). Returns the addresses to connect to (the request goes to these, never to a second
/// look-up's answer).
pub fn addresses_allowed(
    allowed: &[String],
    host: &str,
    resolved: &[SocketAddr],
    is_local: impl Fn(IpAddr) -> bool,
) -> Result<Vec<SocketAddr>, String> {
    if resolved.is_empty() {
        return Err(format!("{host} has no address"));
    }
    for a in resolved {
        let ip = match a.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            ip => ip,
        };
        let local = !special(ip) && is_local(ip);
        if !special(ip) && !local {
            continue;
        }
        let listed = host_allowed(allowed, &ip.to_string(), a.port())
            || (ip.is_loopback() && host == "localhost" && host_allowed(allowed, "localhost", a.port()));
        if !listed && local {
            return Err(format!(
                "{host} resolves to {ip}, an address of this machine, which webhooks may not reach (it leads to the \
                 services listening on every address) unless the lab lists that address in `[notify] webhook_hosts`"
            ));
        }
        if !listed {
            return Err(format!(
                "{host} resolves to {ip}, a loopback, link-local or otherwise special address that webhooks may not reach unless the lab lists that address in `[notify] webhook_hosts`"
            ));
        }
    }
    Ok(resolved.to_vec())
}

/// An email address as a notification target (`name@domain`, no display name, no spaces).
pub fn email(addr: &str) -> Result<(), String> {
    let ok = addr.len() <= 254
        && !addr
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '<' | '>' | ',' | ';' | '"' | '(' | ')'))
        && addr.split_once('@').is_some_and(|(l, d)| {
            !l.is_empty() && d.contains('.') && !d.starts_with('.') && !d.ends_with('.') && !d.contains('@')
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{addr:?} is not an email address (write e.g. ada@lab.org)"))
    }
}

/// `[notify] email_to`: whose addresses a user may subscribe to their notifications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmailTo {
    /// `<their login name>@<a listed domain>`: a user cannot send the lab's mail to someone else.
    #[default]
    Own,
    /// Any address at a listed domain (labs whose mailboxes are not login names).
    Domains,
}

/// Whether `address` is one `user` may have the lab's mail sent to: at one of `domains`, and (with
/// [`EmailTo::Own`], unless an admin adds it) their own mailbox, `<user>@domain`.
pub fn email_allowed(address: &str, user: &str, admin: bool, domains: &[String], to: EmailTo) -> Result<(), String> {
    let (local, domain) = address.rsplit_once('@').unwrap_or((address, ""));
    let domain = domain.to_ascii_lowercase();
    let first = domains.first().map(String::as_str).unwrap_or("lab.org");
    if !domains.contains(&domain) {
        return Err(format!(
            "the lab sends email only to addresses at {} (`[notify] email_domains`), not at {domain}; use your address there, e.g. {user}@{first}",
            if domains.is_empty() { "no domain".to_string() } else { domains.join(", ") }
        ));
    }
    if to == EmailTo::Own && !admin && local != user {
        return Err(format!(
            "you may add only your own address, {user}@{domain}: the lab's mail goes to each user's own mailbox (`[notify] email_to = \"own\"`); to reach another address, forward it from there"
        ));
    }
    Ok(())
}

/// A job's name as a notification's line shows it (an email's subject): no control or direction
/// characters, spaces collapsed, at most [`crate::defaults::NOTIFY_NAME_CHARS`] characters.
pub fn shown_name(name: &str) -> String {
    let max = crate::defaults::NOTIFY_NAME_CHARS;
    let clean: String = name
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .filter(
            |c| !matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'),
        )
        .collect();
    let clean = clean.split_whitespace().collect::<Vec<_>>().join(" ");
    if clean.chars().count() > max {
        // ASCII, so a subject of ASCII stays readable as it is (no RFC 2047 encoding).
        format!("{}...", clean.chars().take(max - 3).collect::<String>())
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_parsed_and_odd_ones_refused() {
        assert_eq!(
            url_syntax("https://Hooks.Slack.com/services/T0/B0/xyz?a=1").unwrap(),
            HookUrl {
                tls: true,
                host: "hooks.slack.com".into(),
                port: 443,
                path: "/services/T0/B0/xyz?a=1".into()
            }
        );
        assert_eq!(
            url_syntax("http://[::1]:8080").unwrap(),
            HookUrl {
                tls: false,
                host: "::1".into(),
                port: 8080,
                path: "/".into()
            }
        );
        for (bad, why) in [
            ("ftp://x/y", "http:// or https://"),
            ("https://user:pw@x.org/", "user name or password"),
            ("https://x.org/a b", "spaces"),
            ("x.org/hook", "URL"),
            ("https:///path", "URL"),
        ] {
            let e = url_syntax(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_labs_list_decides_which_hosts_and_ports() {
        let allowed: Vec<String> = [
            "hooks.slack.com",
            "*.lab.org",
            "127.0.0.1:9000",
            "[::1]:9001",
            "10.0.0.5",
        ]
        .iter()
        .map(|e| host_entry(e).unwrap())
        .collect();
        let cases = [
            ("hooks.slack.com", 443, true),
            ("evil.slack.com", 443, false),
            ("chat.lab.org", 8065, true),
            ("lab.org", 443, false),
            ("notlab.org", 443, false),
            ("127.0.0.1", 9000, true),
            ("127.0.0.1", 22, false),
            ("::1", 9001, true),
            ("10.0.0.5", 1234, true),
            ("169.254.169.254", 80, false),
        ];
        for (host, port, want) in cases {
            assert_eq!(host_allowed(&allowed, host, port), want, "{host}:{port}");
        }
        assert!(host_entry("a b").is_err() && host_entry("x.org:http").is_err() && host_entry("[::1").is_err());
    }

    #[test]
    fn special_addresses_need_the_address_itself_listed() {
        let allowed: Vec<String> = vec!["chat.lab.org".into(), "127.0.0.1:9000".into(), "172.17.0.1:9000".into()];
        let a = |s: &str| vec![s.parse::<SocketAddr>().unwrap()];
        let addresses_allowed = |allowed: &[String], host: &str, resolved: &[SocketAddr]| {
            addresses_allowed(allowed, host, resolved, |ip| {
                ip == "172.17.0.1".parse::<IpAddr>().unwrap()
            })
        };
        assert!(
            addresses_allowed(&allowed, "chat.lab.org", &a("10.1.2.3:443")).is_ok(),
            "a private address of a listed host is the lab's own"
        );
        let e = addresses_allowed(&allowed, "chat.lab.org", &a("172.17.0.1:443")).unwrap_err();
        assert!(
            e.contains("an address of this machine"),
            "docker0's address by a listed name: {e}"
        );
        assert!(
            addresses_allowed(&allowed, "172.17.0.1", &a("172.17.0.1:9000")).is_ok(),
            "the lab listed that address itself"
        );
        for rebound in [
            "127.0.0.1:443",
            "169.254.169.254:80",
            "[::1]:443",
            "[fe80::1]:443",
            "0.0.0.0:80",
            "[::ffff:127.0.0.1]:443",
        ] {
            let e = addresses_allowed(&allowed, "chat.lab.org", &a(rebound)).unwrap_err();
            assert!(e.contains("may not reach"), "{rebound}: {e}");
        }
        assert!(addresses_allowed(&allowed, "127.0.0.1", &a("127.0.0.1:9000")).is_ok());
        assert!(addresses_allowed(&allowed, "127.0.0.1", &a("127.0.0.1:9001")).is_err());
        assert!(addresses_allowed(&allowed, "x", &[]).is_err());
    }

    #[test]
    fn email_targets_are_the_users_own_at_the_labs_domains() {
        use super::EmailTo::{Domains, Own};
        let lab = vec!["lab.org".to_string()];
        assert!(email_allowed("ada@lab.org", "ada", false, &lab, Own).is_ok());
        assert!(email_allowed("ada@LAB.org", "ada", false, &lab, Own).is_ok());
        let e = email_allowed("bob@lab.org", "ada", false, &lab, Own).unwrap_err();
        assert!(e.contains("you may add only your own address, ada@lab.org"), "{e}");
        assert!(
            email_allowed("bob@lab.org", "ada", true, &lab, Own).is_ok(),
            "an admin may"
        );
        assert!(email_allowed("bob@lab.org", "ada", false, &lab, Domains).is_ok());
        let e = email_allowed("ada@gmail.com", "ada", false, &lab, Domains).unwrap_err();
        assert!(
            e.contains("only to addresses at lab.org") && e.contains("e.g. ada@lab.org"),
            "{e}"
        );
    }

    #[test]
    fn email_addresses() {
        assert!(email("ada@lab.org").is_ok());
        for bad in [
            "ada",
            "ada@lab",
            "Ada <ada@lab.org>",
            "a@b.org,c@d.org",
            "a@.org",
            "a\n@b.org",
        ] {
            assert!(email(bad).is_err(), "{bad:?}");
        }
    }
}
