//! Shared by the integration tests: ports for brokers started on loopback.

use std::collections::HashSet;
use std::sync::Mutex;

use nix::sys::socket::{bind, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn};

/// A free loopback port below the kernel's ephemeral range. Ports from `bind(0)` are ephemeral
/// ones, so between the check and the broker's bind a client socket could take one as its source
/// port (the broker then failed with EADDRINUSE), or a connect() loop could connect to itself and
/// report a broker that was not there yet. The probe binds without listening: a child spawned by
/// another test thread inherits the probe's descriptor until its exec, and a listening copy there
/// answered the wait loop's connect before the broker was up (CI flake). Never the same port
/// twice per process.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    if low > 11_000 {
        for _ in 0..1000 {
            let port = 10_000 + (random() % u64::from(low - 10_000)) as u16;
            if !given.contains(&port) && probe(port).is_some() {
                given.insert(port);
                return port;
            }
        }
    }
    loop {
        let port = probe(0).expect("free port");
        if given.insert(port) {
            return port;
        }
    }
}

/// Binds 127.0.0.1:`port` (0: any) without listening; the bound port, if it was free.
fn probe(port: u16) -> Option<u16> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, port),
    )
    .ok()?;
    getsockname::<SockaddrIn>(std::os::fd::AsRawFd::as_raw_fd(&fd))
        .ok()
        .map(|a| a.port())
}

fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}
