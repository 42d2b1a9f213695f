//! Where the proxy may connect: the names it resolves itself, and the
//! addresses it refuses unless the allowlist names them (the host's own
//! loopback, private networks, link-local, unique-local): a name on the
//! list that resolves there is DNS rebinding into the host's services.

use super::allowlist::{canonical_ip, Allowlist};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Debug builds only: `name=addr[,addr…];…`, names resolved to these
/// addresses instead of through the host's resolver. The tests map names
/// to their servers on the host's loopback with it; a release build
/// ignores it.
pub const TEST_RESOLVE_ENV: &str = "CONFINE_TEST_RESOLVE";

/// Why a target gives the proxy no address to connect to.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    /// `kind`: what the address is ([`non_public`], the host's own, a
    /// cloud platform's endpoint).
    #[error("{host} resolves to {ip} ({kind}), which the allowlist does not name")]
    Unlisted { host: String, ip: IpAddr, kind: &'static str },
    #[error("{0} has no address")]
    NoAddress(String),
    #[cfg(target_os = "linux")]
    #[error("cannot list this host's addresses: {0}")]
    OwnAddresses(nix::errno::Errno),
    #[error("{name} does not resolve: {source}")]
    Unresolved { name: String, source: std::io::Error },
}

/// What kind of address this is, when it is not a public one.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match canonical_ip(ip) {
        IpAddr::V4(a) => v4_kind(a),
        IpAddr::V6(a) => v6_kind(a),
    }
}

fn v4_kind(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    Some(match o {
        _ if a.is_loopback() => "loopback",
        _ if a.is_unspecified() || o[0] == 0 => "unspecified",
        _ if a.is_private() => "private",
        _ if a.is_link_local() => "link-local",
        [100, b, ..] if (64..128).contains(&b) => "shared (carrier-grade NAT)",
        [192, 0, 0, _] => "IETF protocol assignments",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking",
        _ if a.is_multicast() => "multicast",
        _ if a.is_broadcast() || o[0] >= 240 => "reserved",
        _ if a.is_documentation() => "documentation",
        _ => return None,
    })
}

fn v6_kind(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    Some(match s {
        _ if a.is_loopback() => "loopback",
        _ if a.is_unspecified() => "unspecified",
        _ if a.is_multicast() => "multicast",
        [x, ..] if x & 0xffc0 == 0xfe80 => "link-local",
        [x, ..] if x & 0xffc0 == 0xfec0 => "site-local",
        [x, ..] if x & 0xfe00 == 0xfc00 => "unique-local",
        [0x2001, 0xdb8, ..] => "documentation",
        // NAT64 (well-known and local-use), SIIT and 6to4 carry an IPv4
        // address: it decides.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => return v4_kind(embedded(hi, lo)),
        [0x64, 0xff9b, 1, _, _, _, hi, lo] => return v4_kind(embedded(hi, lo)).or(Some("NAT64 local-use")),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => return v4_kind(embedded(hi, lo)),
        [0x2002, hi, lo, ..] => return v4_kind(embedded(hi, lo)),
        // Teredo: a tunnel whose far end the address does not say.
        [0x2001, 0, ..] => "Teredo",
        // IPv4-compatible (deprecated) ::a.b.c.d.
        [0, 0, 0, 0, 0, 0, hi, lo] => return v4_kind(embedded(hi, lo)),
        _ => return None,
    })
}

fn embedded(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

/// Public addresses that are a cloud host's own endpoint for its VMs,
/// served to root on the VM only: the proxy connects as root.
fn platform_endpoint(ip: IpAddr) -> Option<&'static str> {
    (ip == IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16))).then_some("Azure's platform endpoint (WireServer)")
}

/// Keep the addresses the proxy may connect to: public ones that are not
/// the host's own (`own`: every address of its interfaces) nor a cloud
/// platform's endpoint, and others only where the allowlist names them.
/// None left: why, naming the first refused address.
pub fn permitted(
    addrs: Vec<SocketAddr>,
    list: &Allowlist,
    host: &str,
    own: &[IpAddr],
) -> Result<Vec<SocketAddr>, AddrError> {
    let mut refused = None;
    let mut out = Vec::new();
    for a in addrs {
        let ip = canonical_ip(a.ip());
        // An address of this host reaches its services from the host
        // itself, past firewall rules that trust local traffic, whatever
        // range it is in.
        let kind = non_public(ip)
            .or_else(|| own.iter().any(|o| canonical_ip(*o) == ip).then_some("an address of this host"))
            .or_else(|| platform_endpoint(ip));
        match kind {
            Some(kind) if !list.names_address(ip, a.port()) => {
                refused.get_or_insert_with(|| AddrError::Unlisted { host: host.to_string(), ip, kind });
            }
            _ => out.push(SocketAddr::new(ip, a.port())),
        }
    }
    match (out.is_empty(), refused) {
        (false, _) => Ok(out),
        (true, Some(why)) => Err(why),
        (true, None) => Err(AddrError::NoAddress(host.to_string())),
    }
}

/// Every address of the host's interfaces, read at each decision (they
/// change: DHCP, hotplug). Unreadable, the decision fails closed.
#[cfg(target_os = "linux")]
pub fn own_addresses() -> Result<Vec<IpAddr>, AddrError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(AddrError::OwnAddresses)?;
    Ok(addrs
        .filter_map(|a| {
            let sa = a.address?;
            sa.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .collect())
}

/// The name's addresses from the test override (debug builds), if it names them.
fn overridden(name: &str, port: u16) -> Option<Vec<SocketAddr>> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let map = std::env::var(TEST_RESOLVE_ENV).ok()?;
    for item in map.split(';') {
        let (n, addrs) = item.split_once('=')?;
        if n.eq_ignore_ascii_case(name) {
            let addrs = addrs.split(',').filter_map(|a| a.trim().parse::<IpAddr>().ok());
            return Some(addrs.map(|ip| SocketAddr::new(ip, port)).collect());
        }
    }
    None
}

/// Resolve `name` (normalized) on the host, as the proxy itself.
pub async fn resolve(name: &str, port: u16) -> Result<Vec<SocketAddr>, AddrError> {
    if let Some(addrs) = overridden(name, port) {
        return Ok(addrs);
    }
    // Absolute (a trailing dot): the host's search domains never apply.
    match tokio::net::lookup_host((format!("{name}."), port)).await {
        Ok(addrs) => Ok(addrs.collect()),
        Err(source) => Err(AddrError::Unresolved { name: name.to_string(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_its_networks_are_not_public() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00::1", "unique-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:a00:1::", "private"),
            ("::127.0.0.1", "loopback"),
            ("::ffff:0:7f00:1", "loopback"),
            ("64:ff9b:1::a00:1", "private"),
            ("64:ff9b:1::5db8:d822", "NAT64 local-use"),
            ("2001:0:4136:e378::1", "Teredo"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
        ] {
            assert_eq!(non_public(ip.parse().unwrap()), Some(kind), "{ip}");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "64:ff9b::5db8:d822"] {
            assert_eq!(non_public(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn non_public_addresses_pass_only_when_listed() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let list = Allowlist::parse(&["app.test", "127.0.0.1:8080"]).unwrap();
        let e = permitted(vec![sa("127.0.0.1:443")], &list, "app.test", &[]).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1 (loopback)"), "{e}");
        assert_eq!(permitted(vec![sa("127.0.0.1:8080")], &list, "app.test", &[]).unwrap(), [sa("127.0.0.1:8080")]);
        // A public address beside a private one: only the public one is used.
        let both = vec![sa("10.0.0.1:443"), sa("93.184.216.34:443")];
        assert_eq!(permitted(both, &list, "app.test", &[]).unwrap(), [sa("93.184.216.34:443")]);
        assert!(permitted(vec![], &list, "app.test", &[]).unwrap_err().to_string().contains("no address"));
    }

    /// A name that resolves to one of the host's own public addresses
    /// reaches the host's services from the host itself: refused unless the
    /// list names the address (red team, finding F1). So is Azure's
    /// WireServer, which serves root on the VM.
    #[test]
    fn the_hosts_own_and_platform_addresses_are_refused() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let own: Vec<IpAddr> = vec!["45.33.0.77".parse().unwrap(), "2600:3c01::77".parse().unwrap()];
        let list = Allowlist::parse(&["app.test", "45.33.0.77:9000"]).unwrap();
        let e = permitted(vec![sa("45.33.0.77:8081")], &list, "app.test", &own).unwrap_err().to_string();
        assert!(e.contains("45.33.0.77 (an address of this host)"), "{e}");
        let e = permitted(vec![sa("[::ffff:45.33.0.77]:443")], &list, "app.test", &own).unwrap_err().to_string();
        assert!(e.contains("an address of this host"), "{e}");
        let e = permitted(vec![sa("[2600:3c01::77]:443")], &list, "app.test", &own).unwrap_err().to_string();
        assert!(e.contains("an address of this host"), "{e}");
        assert_eq!(permitted(vec![sa("45.33.0.77:9000")], &list, "app.test", &own).unwrap(), [sa("45.33.0.77:9000")]);
        let e = permitted(vec![sa("168.63.129.16:80")], &list, "app.test", &own).unwrap_err().to_string();
        assert!(e.contains("WireServer"), "{e}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_addresses_lists_every_interface() {
        let own = own_addresses().unwrap();
        assert!(own.contains(&"127.0.0.1".parse().unwrap()), "{own:?}");
        // Every global address `ip` shows is there too.
        let shown = std::process::Command::new("ip").args(["-o", "addr"]).output();
        if let Ok(out) = shown {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let mut words = line.split_whitespace();
                let Some(addr) = words.find(|w| *w == "inet" || *w == "inet6").and(words.next()) else { continue };
                let ip: IpAddr = addr.split('/').next().unwrap().parse().unwrap();
                assert!(own.contains(&ip), "{ip} missing from {own:?}");
            }
        }
    }
}
