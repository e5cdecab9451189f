//! The `[notify]` and `[metrics]` sections.

use super::*;

impl Check<'_> {
    pub(super) fn notify(&mut self, raw: &RawNotify) -> NotifySettings {
        use crate::protocol::notify::NotifyEvent;
        let mut n = NotifySettings::default();
        if let Some(hosts) = &raw.webhook_hosts {
            for h in hosts.get_ref() {
                match crate::notify::check::host_entry(h.get_ref()) {
                    Ok(e) => n.webhook_hosts.push(e),
                    Err(why) => self.fail(h.span(), format!("`webhook_hosts` lists {:?}: {why}", h.get_ref()), "write a host name (\"hooks.slack.com\"), \"*.lab.org\" or an IP address, optionally with \":PORT\""),
                }
            }
        }
        for hook in raw.webhooks.iter().flat_map(|w| w.get_ref()) {
            let h = hook.get_ref();
            if let Err(why) = crate::notify::check::url_syntax(h.url.get_ref()) {
                self.fail(
                    h.url.span(),
                    format!("a lab webhook's `url` = {:?} {why}", h.url.get_ref()),
                    "write e.g. \"https://chat.lab.org/hooks/abc\"",
                );
                continue;
            }
            let mut on = vec![];
            for e in &h.on {
                match NotifyEvent::parse(e.get_ref()).filter(|e| *e != NotifyEvent::Test) {
                    Some(ev) => on.push(ev),
                    None => self.fail(
                        e.span(),
                        format!("a lab webhook's `on` lists {:?}, which is not an event", e.get_ref()),
                        format!("use some of: {}", NotifyEvent::names()),
                    ),
                }
            }
            if h.on.is_empty() {
                on = vec![NotifyEvent::StoreProblem];
            }
            n.webhooks.push((h.url.get_ref().clone(), on));
        }
        if let Some(t) = self.count("max_tries", &raw.max_tries, 100) {
            n.max_tries = t as u32;
        }
        if let Some(d) = self.duration("retry_backoff", &raw.retry_backoff, config::NOTIFY_BACKOFF_MAX) {
            n.retry_backoff = d;
        }
        if let Some(m) = self.count("max_pending", &raw.max_pending, 100_000) {
            n.max_pending = m as usize;
        }
        if let Some(m) = self.count("max_targets", &raw.max_targets, 1000) {
            n.max_targets = m as usize;
        }
        if let Some(m) = self.count("max_tests_per_hour", &raw.max_tests_per_hour, 1000) {
            n.max_tests_per_hour = m as usize;
        }
        if let Some(list) = &raw.email_domains {
            let mut domains = vec![];
            for d in list.get_ref() {
                let v = d.get_ref().trim().trim_start_matches('@').to_ascii_lowercase();
                if crate::notify::check::email(&format!("x@{v}")).is_err() {
                    self.fail(
                        d.span(),
                        format!("`email_domains` lists {:?}, which is not a mail domain", d.get_ref()),
                        "write e.g. \"lab.org\"",
                    );
                } else {
                    domains.push(v);
                }
            }
            n.email_domains = Some(domains);
        }
        match raw.email_to.as_ref().map(|v| (v.get_ref().as_str(), v.span())) {
            None | Some(("own", _)) => n.email_to = super::EmailTo::Own,
            Some(("domains", _)) => n.email_to = super::EmailTo::Domains,
            Some((other, span)) => self.fail(span, format!("`email_to` = {other:?} is not a choice"), "write \"own\" (a user adds only <login name>@ a listed domain) or \"domains\" (any address at a listed domain)"),
        }
        let starttls = raw.smtp_starttls.as_ref().map(|b| *b.get_ref()).unwrap_or(true);
        let port = match &raw.smtp_port {
            Some(p) if (1..=65535).contains(p.get_ref()) => *p.get_ref() as u16,
            Some(p) => {
                self.fail(
                    p.span(),
                    format!("`smtp_port` = {} is not a port", p.get_ref()),
                    "write e.g. 587 (submission with STARTTLS) or 25",
                );
                0
            }
            None if starttls => 587,
            None => 25,
        };
        match (&raw.smtp_host, &raw.smtp_from) {
            (Some(host), Some(from)) => {
                if host.get_ref().trim().is_empty() || host.get_ref().chars().any(|c| c.is_whitespace() || c == '/') {
                    self.fail(
                        host.span(),
                        format!("`smtp_host` = {:?} is not a host name", host.get_ref()),
                        "write the relay's name, e.g. \"smtp.lab.org\"",
                    );
                }
                if crate::notify::check::email(from.get_ref()).is_err() {
                    self.fail(
                        from.span(),
                        format!("`smtp_from` = {:?} is not an email address", from.get_ref()),
                        "write e.g. \"gantry@lab.org\"",
                    );
                }
                let credentials = raw.smtp_credentials.as_ref().and_then(|c| {
                    let p = PathBuf::from(c.get_ref());
                    if p.is_absolute() {
                        Some(p)
                    } else {
                        self.fail(
                            c.span(),
                            format!("`smtp_credentials` = {:?} is not an absolute path", c.get_ref()),
                            "write e.g. \"/etc/gantry/smtp-credentials\" (mode 600, owned by root)",
                        );
                        None
                    }
                });
                n.smtp = Some(SmtpSettings {
                    host: host.get_ref().trim().to_string(),
                    port,
                    starttls,
                    from: from.get_ref().clone(),
                    credentials,
                });
            }
            (Some(host), None) => self.fail(
                host.span(),
                "`smtp_host` is set but `smtp_from` is not".into(),
                "add smtp_from = \"gantry@YOUR.DOMAIN\" (the sender of notification emails)",
            ),
            (None, Some(from)) => self.fail(
                from.span(),
                "`smtp_from` is set but `smtp_host` is not".into(),
                "add smtp_host = \"smtp.YOUR.DOMAIN\" (the relay to send through)",
            ),
            (None, None) => {
                for (key, span) in [
                    ("smtp_port", raw.smtp_port.as_ref().map(|v| v.span())),
                    ("smtp_starttls", raw.smtp_starttls.as_ref().map(|v| v.span())),
                    ("smtp_credentials", raw.smtp_credentials.as_ref().map(|v| v.span())),
                ] {
                    if let Some(span) = span {
                        self.fail(
                            span,
                            format!("`{key}` is set but `smtp_host` is not"),
                            "add smtp_host and smtp_from, or remove it",
                        );
                    }
                }
            }
        }
        n
    }

    pub(super) fn metrics(&mut self, raw: &RawMetrics) -> MetricsSettings {
        let mut m = MetricsSettings {
            allow_remote: raw.allow_remote.as_ref().map(|b| *b.get_ref()).unwrap_or(false),
            ..MetricsSettings::default()
        };
        if let Some(n) = self.count("max_connections", &raw.max_connections, 100_000) {
            m.max_connections = n as usize;
        }
        if let Some(d) = self.duration("idle_timeout", &raw.idle_timeout, Duration::from_secs(3600)) {
            m.idle_timeout = d;
        }
        if let Some(l) = &raw.listen {
            match l.get_ref().parse::<std::net::SocketAddr>() {
                Ok(a) if !a.ip().is_loopback() && !m.allow_remote => self.fail(
                    l.span(),
                    format!("metrics `listen` = {:?} is not a loopback address", l.get_ref()),
                    "anyone who can reach it sees each user's GPU use: listen on \"127.0.0.1:9464\" (and let a local Prometheus or proxy scrape it), or set allow_remote = true",
                ),
                Ok(a) => m.listen = Some(a),
                Err(_) => self.fail(l.span(), format!("metrics `listen` = {:?} is not an address and port", l.get_ref()), "write e.g. \"127.0.0.1:9464\""),
            }
        }
        m
    }
}
