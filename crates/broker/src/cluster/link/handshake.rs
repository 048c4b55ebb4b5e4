//! The link's handshake: a challenge-response on the shared cookie, in which neither side
//! sends the cookie and each proves it holds it; each side also learns the other's name and
//! link address.

use bytes::{BufMut, BytesMut};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::codec::put_str;
use super::Links;

/// Version 2: publishes, deliveries, settles and confirms travel in runs ([`Link::send_run`](super::Link::send_run));
/// a node speaking version 1 is refused at the handshake rather than misread.
const MAGIC: &[u8; 8] = b"WARRENL2";

impl Links {
    fn proof(&self, nonce: &[u8], side: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(&self.cookie);
        h.update(nonce);
        h.update(side);
        h.finalize().into()
    }

    pub(super) async fn dial_handshake(
        &self,
        s: &mut TcpStream,
    ) -> Result<(String, String), String> {
        let nonce: [u8; 16] = rand::random();
        let mut b = BytesMut::new();
        b.put_slice(MAGIC);
        put_str(&mut b, &self.me);
        put_str(&mut b, &self.my_addr);
        b.put_slice(&nonce);
        s.write_all(&b).await.map_err(|e| e.to_string())?;
        // Challenge: peer's name, address, nonce, proof of our nonce.
        let name = read_str(s).await?;
        let addr = read_str(s).await?;
        let mut peer_nonce = [0u8; 16];
        s.read_exact(&mut peer_nonce)
            .await
            .map_err(|e| e.to_string())?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await.map_err(|e| e.to_string())?;
        if proof != self.proof(&nonce, b"s") {
            return Err(format!("node {name} does not hold this cluster's cookie"));
        }
        s.write_all(&self.proof(&peer_nonce, b"c"))
            .await
            .map_err(|e| e.to_string())?;
        let mut ok = [0u8; 1];
        s.read_exact(&mut ok)
            .await
            .map_err(|_| format!("node {name} refused this node's cookie"))?;
        Ok((name, addr))
    }

    pub(super) async fn accept_handshake(
        &self,
        s: &mut TcpStream,
    ) -> Result<(String, String), String> {
        let mut magic = [0u8; 8];
        s.read_exact(&mut magic).await.map_err(|e| e.to_string())?;
        if &magic != MAGIC {
            return Err("not a Warren node (bad preamble)".into());
        }
        let name = read_str(s).await?;
        let addr = read_str(s).await?;
        let mut peer_nonce = [0u8; 16];
        s.read_exact(&mut peer_nonce)
            .await
            .map_err(|e| e.to_string())?;
        let nonce: [u8; 16] = rand::random();
        let mut b = BytesMut::new();
        put_str(&mut b, &self.me);
        put_str(&mut b, &self.my_addr);
        b.put_slice(&nonce);
        b.put_slice(&self.proof(&peer_nonce, b"s"));
        s.write_all(&b).await.map_err(|e| e.to_string())?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await.map_err(|e| e.to_string())?;
        if proof != self.proof(&nonce, b"c") {
            return Err(format!(
                "node {name} ({addr}) does not hold this cluster's cookie"
            ));
        }
        s.write_all(&[1]).await.map_err(|e| e.to_string())?;
        Ok((name, addr))
    }
}

async fn read_str(s: &mut TcpStream) -> Result<String, String> {
    let n = s.read_u16().await.map_err(|e| e.to_string())? as usize;
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).await.map_err(|e| e.to_string())?;
    String::from_utf8(v).map_err(|_| "bad string".to_string())
}
