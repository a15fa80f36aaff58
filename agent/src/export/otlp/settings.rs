//! Where and how the OTLP exporter sends, read as the OpenTelemetry SDKs read it: the
//! `OTEL_EXPORTER_OTLP_*` variables of the OTLP exporter specification, each also as
//! `OTEL_EXPORTER_OTLP_LOGS_*` (which wins), and `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`.
//! A value kstall cannot honour is refused at start with the variable's name, never ignored.

use std::{path::PathBuf, time::Duration};

use crate::setting::Invalid;

/// How the records travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub protocol: Protocol,
    /// The full URL: for HTTP with `/v1/logs`, for gRPC the server's (its path unused).
    pub endpoint: String,
    /// Sent with every export (`authorization`, a tenant id, ...).
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    /// CA certificates (PEM) for an `https://` endpoint, else the system's.
    pub certificate: Option<PathBuf>,
    /// A client certificate and its key (PEM), for an endpoint that asks for one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// `service.name` of every record's resource.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, on every resource.
    pub resource: Vec<(String, String)>,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment as `lookup` gives it (the process's, or a test's).
pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Settings, Invalid> {
    // A variable set but empty is unset, as the SDKs take it.
    let get = |name: &str| lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    // The logs' own variable wins over the general one; an error names the one given.
    let either = |logs: &'static str, general: &'static str| -> Option<(&'static str, String)> {
        get(logs).map(|v| (logs, v)).or_else(|| get(general).map(|v| (general, v)))
    };
    let protocol = match either("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") {
        None => Protocol::HttpProtobuf,
        Some((_, v)) if v == "grpc" => Protocol::Grpc,
        Some((_, v)) if v == "http/protobuf" => Protocol::HttpProtobuf,
        Some((name, v)) => {
            return Err((name, format!("{v:?} is not grpc or http/protobuf (http/json is not supported)")));
        }
    };
    let endpoint =
        match (get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT"), protocol) {
            (Some(logs), _, _) => checked_url("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", logs)?,
            (None, Some(base), Protocol::Grpc) => checked_url("OTEL_EXPORTER_OTLP_ENDPOINT", base)?,
            // The general endpoint is a base: each signal's path goes under it.
            (None, Some(base), Protocol::HttpProtobuf) => {
                let base = checked_url("OTEL_EXPORTER_OTLP_ENDPOINT", base)?;
                format!("{}/v1/logs", base.trim_end_matches('/'))
            }
            (None, None, Protocol::Grpc) => "http://localhost:4317".into(),
            (None, None, Protocol::HttpProtobuf) => "http://localhost:4318/v1/logs".into(),
        };
    let headers = match either("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS") {
        Some((name, list)) => pairs(&list).map_err(|e| (name, e))?,
        None => Vec::new(),
    };
    for (name, _) in &headers {
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return Err(("OTEL_EXPORTER_OTLP_HEADERS", format!("{name:?} is not a header name")));
        }
    }
    let timeout = match either("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT") {
        Some((name, ms)) => match ms.parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => return Err((name, format!("{ms:?} is not a positive number of milliseconds"))),
        },
        None => DEFAULT_TIMEOUT,
    };
    if let Some((name, compression)) =
        either("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION")
        && compression != "none"
    {
        return Err((name, format!("{compression:?}: only none is supported")));
    }
    let file = |logs: &'static str, general: &'static str| -> Result<Option<PathBuf>, Invalid> {
        match either(logs, general) {
            Some((name, path)) => match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => Ok(Some(PathBuf::from(path))),
                Ok(_) => Err((name, format!("{path}: not a file"))),
                Err(e) => Err((name, format!("{path}: {e}"))),
            },
            None => Ok(None),
        }
    };
    let certificate = file("OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")?;
    let client = match (
        file("OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")?,
        file("OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY")?,
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err((
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "a client certificate needs its key (OTEL_EXPORTER_OTLP_CLIENT_KEY), and a key its certificate"
                    .into(),
            ));
        }
    };
    let resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(list) => pairs(&list).map_err(|e| ("OTEL_RESOURCE_ATTRIBUTES", e))?,
        None => Vec::new(),
    };
    let service_name = get("OTEL_SERVICE_NAME")
        .or_else(|| resource.iter().find(|(k, _)| k == "service.name").map(|(_, v)| v.clone()))
        .unwrap_or_else(|| "kstall".into());
    Ok(Settings { protocol, endpoint, headers, timeout, certificate, client, service_name, resource })
}

/// `http://` or `https://` with a host.
fn checked_url(name: &'static str, url: String) -> Result<String, Invalid> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(url),
        _ => Err((name, format!("{url:?} is not an http:// or https:// URL"))),
    }
}

/// `key1=value1,key2=value2`, each value percent-decoded (the W3C Baggage form the
/// specification names).
fn pairs(list: &str) -> Result<Vec<(String, String)>, String> {
    list.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (k, v) = item.split_once('=').ok_or_else(|| format!("{item:?} is not key=value"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(format!("{item:?} has no key"));
            }
            Ok((k.to_string(), percent_decoded(v).ok_or_else(|| format!("{v:?}: a bad %-escape"))?))
        })
        .collect()
}

fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Settings, Invalid> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_env(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_specifications_defaults_and_where_each_variable_goes() {
        let none = from(&[]).unwrap();
        assert_eq!(
            (none.protocol, none.endpoint.as_str()),
            (Protocol::HttpProtobuf, "http://localhost:4318/v1/logs")
        );
        assert_eq!((none.timeout, none.service_name.as_str()), (Duration::from_secs(10), "kstall"));
        let grpc = from(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap();
        assert_eq!(grpc.endpoint, "http://localhost:4317");
        // The general endpoint is a base for HTTP, the server for gRPC; the logs' own is used as
        // given, and wins.
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/")];
        assert_eq!(from(&base).unwrap().endpoint, "https://collector:4318/v1/logs");
        let grpc_base =
            [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4317")];
        assert_eq!(from(&grpc_base).unwrap().endpoint, "https://c:4317");
        let own = [base[0], ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://logs:9000/ingest")];
        assert_eq!(from(&own).unwrap().endpoint, "http://logs:9000/ingest");
        let logs_protocol =
            [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"), ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "grpc")];
        assert_eq!(from(&logs_protocol).unwrap().protocol, Protocol::Grpc);
        let headers =
            from(&[("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k%3D, x-tenant = a ")]).unwrap();
        let expected = [("authorization", "Bearer t0k="), ("x-tenant", "a")]
            .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(headers.headers, expected);
        let named = from(&[
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=node-agent,k8s.cluster.name=eu-1"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap();
        assert_eq!((named.service_name.as_str(), named.timeout), ("node-agent", Duration::from_millis(2500)));
        let service =
            from(&[("OTEL_SERVICE_NAME", "kstall-eu"), ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x")]);
        assert_eq!(service.unwrap().service_name, "kstall-eu", "OTEL_SERVICE_NAME wins");
    }

    #[test]
    fn a_value_kstall_cannot_honour_is_an_error_naming_its_variable() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("client.crt");
        std::fs::write(&cert, "").unwrap();
        let cert = cert.to_str().unwrap();
        let cases: [(&[(&str, &str)], &str); 9] = [
            (&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")], "OTEL_EXPORTER_OTLP_PROTOCOL"),
            (&[("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "udp")], "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")], "OTEL_EXPORTER_OTLP_ENDPOINT"),
            (&[("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign")], "OTEL_EXPORTER_OTLP_HEADERS"),
            (&[("OTEL_EXPORTER_OTLP_HEADERS", "bad header=x")], "OTEL_EXPORTER_OTLP_HEADERS"),
            (&[("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")], "OTEL_EXPORTER_OTLP_TIMEOUT"),
            (&[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")], "OTEL_EXPORTER_OTLP_COMPRESSION"),
            (&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.crt")], "OTEL_EXPORTER_OTLP_CERTIFICATE"),
            (&[("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert)], "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        ];
        for (vars, variable) in cases {
            let (key, message) = from(vars).expect_err(variable);
            assert_eq!(key, variable, "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
