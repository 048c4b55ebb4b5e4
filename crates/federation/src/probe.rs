//! What an upstream says of itself in `connection.start`: its `cluster_name` (RabbitMQ's
//! federation uses it to stop cycles: a binding is not passed back to a cluster it came from,
//! and the `x-received-from` entries name it) and its capabilities (a federated queue needs
//! `consumer_priorities`). lapin reads the server's properties and keeps them to itself, so a
//! link asks on a connection of its own first: the protocol header, then the first frame read
//! with Warren's own decoder, then the socket is dropped. Over TLS it presents the link's CA
//! and client certificate; without a `cacertfile` (lapin then trusts the system's roots) it does
//! not ask, and the name stays unknown, as RabbitMQ leaves it when a server does not say.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use warren_protocol::frame::FrameDecoder;
use warren_protocol::method::Method;
use warren_protocol::{FieldTable, FieldValue};
use warren_shovel::uri::Remote;

const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the link needs from the upstream's server properties.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerInfo {
    /// `cluster_name`, when the server sends one.
    pub cluster_name: Option<String>,
    /// `capabilities.consumer_priorities`.
    pub consumer_priorities: bool,
}

impl ServerInfo {
    pub fn from_properties(p: &FieldTable) -> ServerInfo {
        let text = |v: &FieldValue| match v {
            FieldValue::LongStr(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        };
        ServerInfo {
            cluster_name: p.get("cluster_name").and_then(text),
            consumer_priorities: matches!(
                p.get("capabilities"),
                Some(FieldValue::Table(c)) if matches!(c.get("consumer_priorities"), Some(FieldValue::Bool(true)))
            ),
        }
    }
}

/// The upstream's server properties, or `None` when they cannot be asked for (TLS without a
/// CA file).
pub async fn server_info(r: &Remote) -> Result<Option<ServerInfo>, String> {
    let addr = format!("{}:{}", r.host, r.port);
    let ask = async {
        let tcp = TcpStream::connect(&addr)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        if !r.tls {
            return first_frame(tcp).await.map(Some);
        }
        let Some(config) = tls_config(r)? else {
            return Ok(None);
        };
        let name = ServerName::try_from(r.host.clone())
            .map_err(|e| format!("bad server name {}: {e}", r.host))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {addr}: {e}"))?;
        first_frame(tls).await.map(Some)
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .map_err(|_| format!("{addr} did not send connection.start within {PROBE_TIMEOUT:?}"))?
}

fn tls_config(r: &Remote) -> Result<Option<rustls::ClientConfig>, String> {
    let Some(ca) = &r.cacertfile else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("cannot read {ca}: {e}"))? {
        roots
            .add(cert.map_err(|e| format!("cannot read {ca}: {e}"))?)
            .map_err(|e| format!("bad CA certificate in {ca}: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_root_certificates(roots);
    let config = match (&r.certfile, &r.keyfile) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<_, _>>())
                .map_err(|e| format!("cannot read {cert}: {e}"))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| format!("cannot read {key}: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("tls: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// Sends the protocol header and reads `connection.start`'s server properties.
async fn first_frame<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> Result<ServerInfo, String> {
    s.write_all(b"AMQP\x00\x00\x09\x01")
        .await
        .map_err(|e| e.to_string())?;
    let decoder = FrameDecoder::new(0);
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        if let Some(f) = decoder.decode(&mut buf).map_err(|e| format!("{e:?}"))? {
            return match Method::decode(&f.payload) {
                Ok(Method::ConnectionStart(m)) => {
                    Ok(ServerInfo::from_properties(&m.server_properties))
                }
                Ok(other) => Err(format!("the server sent {other:?} before connection.start")),
                Err(e) => Err(format!("unreadable connection.start: {e:?}")),
            };
        }
        if buf.len() > 1 << 20 {
            return Err("connection.start larger than 1 MiB".into());
        }
        if s.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the server closed the connection before connection.start".into());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn reads_the_cluster_name_and_the_capability() {
        let caps = FieldTable(vec![("consumer_priorities".into(), FieldValue::Bool(true))]);
        let p = FieldTable(vec![
            (
                "cluster_name".into(),
                FieldValue::LongStr(Bytes::from_static(b"rabbit@a")),
            ),
            ("capabilities".into(), FieldValue::Table(caps)),
        ]);
        assert_eq!(
            ServerInfo::from_properties(&p),
            ServerInfo {
                cluster_name: Some("rabbit@a".into()),
                consumer_priorities: true
            }
        );
        assert_eq!(
            ServerInfo::from_properties(&FieldTable::default()),
            ServerInfo::default()
        );
    }
}
