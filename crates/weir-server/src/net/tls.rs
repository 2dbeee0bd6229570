//! TLS on a server's listener (rustls with ring): the certificate chain, its key and, for
//! mutual TLS, the CA that clients' certificates must chain to — each file reloaded when its
//! contents change (a rotated certificate applies to the next connection; connections open
//! keep theirs).
//!
//! Who may call it: the operator names the files. A client gets a handshake bounded by the
//! connection's first-request timeout; with a client CA, a client without a certificate that
//! chains to it is refused during the handshake. A file that cannot be read or parsed at a
//! reload is logged and counted (`weir_tls_reloads_total{result="rejected"}`), and the
//! certificates in force stay.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;

use crate::admin::metrics::{Collector, Encoder};
use crate::reload::Reloads;

/// The files of a listener's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM (the server's first).
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA clients' certificates must chain to, PEM; `None`: clients present none.
    pub client_ca: Option<PathBuf>,
}

/// A TLS file or setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file that cannot be read, or holds no usable PEM.
    #[error("{}: {reason}", file.display())]
    File {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Files that do not make a configuration (a key that is not the certificate's).
    #[error("TLS: {0}")]
    Config(String),
}

/// A listener's TLS, reloaded when its files change.
pub struct ServerTls {
    files: TlsFiles,
    config: ArcSwap<ServerConfig>,
    reloads: Arc<Reloads>,
    watchers: parking_lot::Mutex<Vec<weir_rules::watch::Watcher>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// TLS from `files` (HTTP/2 offered by ALPN, as gRPC needs).
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let config = server_config(&files)?;
        Ok(Arc::new(Self {
            files,
            config: ArcSwap::from_pointee(config),
            reloads: Arc::default(),
            watchers: parking_lot::Mutex::new(Vec::new()),
        }))
    }

    /// Reads the files again; on error the configuration in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = server_config(&self.files)?;
        self.config.store(Arc::new(config));
        Ok(())
    }

    /// Checks the files every `interval` and reloads when one changed (by content).
    pub fn watch(self: &Arc<Self>, interval: Duration) {
        let mut paths = vec![self.files.cert.clone(), self.files.key.clone()];
        paths.extend(self.files.client_ca.clone());
        for path in paths {
            match crate::reload::watch(
                self,
                path,
                interval,
                self.reloads.clone(),
                "TLS certificates",
                Self::reload,
            ) {
                Ok(w) => self.watchers.lock().push(w),
                Err(e) => tracing::error!(error = %e, "cannot watch the TLS files for changes"),
            }
        }
    }

    /// The counts of reloads, as a collector of a process's registry
    /// (`weir_tls_reloads_total`).
    pub fn collector(&self) -> impl Collector {
        TlsCollector(self.reloads.clone())
    }

    /// The server side of a TLS handshake on `tcp`, within `timeout`: the connection over TLS
    /// (a server is generic over its transport, so a plain connection pays nothing for this).
    pub async fn accept(
        &self,
        tcp: TcpStream,
        timeout: Duration,
    ) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.load_full());
        match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake not finished in time",
            )),
        }
    }
}

#[derive(Debug)]
struct TlsCollector(Arc<Reloads>);

impl Collector for TlsCollector {
    fn encode(&self, mut enc: Encoder) -> std::fmt::Result {
        self.0.encode(
            &mut enc,
            "weir_tls_reloads",
            "Changes of the TLS certificate files seen, by result (rejected: the previous certificates stay).",
        )
    }
}

/// The crypto every configuration uses.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::File {
        file: files.key.clone(),
        reason: format!("no private key: {e}"),
    })?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| TlsError::File {
                    file: ca.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(format!("{}: {e}", files.key.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Every certificate of a PEM file (at least one).
pub(crate) fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::File {
        file: file.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate".into()));
    }
    Ok(certs)
}
