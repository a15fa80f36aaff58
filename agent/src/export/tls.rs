//! TLS for the outputs that push over https (Alertmanager, OTLP over HTTP): trust in a CA file's
//! certificates or the system's store, and a client certificate where the endpoint asks for one.

use std::{path::Path, sync::Arc};

use rustls::pki_types::{PrivateKeyDer, pem::PemObject as _};

/// The configuration for `https://` endpoints.
pub fn client_config(
    ca_file: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match ca_file {
        Some(path) => {
            let certs = crate::named_file::certificates(path)?;
            let mut roots = rustls::RootCertStore::empty();
            if roots.add_parsable_certificates(certs).0 == 0 {
                return Err(format!("{}: no CA certificate in it", path.display()));
            }
            builder.with_root_certificates(roots)
        }
        None => rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(builder)
            .map_err(|e| format!("the system's trust store: {e}"))?,
    };
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert_file, key_file)) => {
            let chain = crate::named_file::certificates(cert_file)?;
            if chain.is_empty() {
                return Err(format!("{}: no certificate in it", cert_file.display()));
            }
            let pem = crate::named_file::read(key_file, 1 << 20)?;
            let key =
                PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{}: {e}", key_file.display()))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("{}: {e}", cert_file.display()))
        }
    }
}

/// A configuration that trusts nothing, for a connector that only ever speaks plain http (a
/// container image may have no trust store).
pub fn plain_http_only() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}
