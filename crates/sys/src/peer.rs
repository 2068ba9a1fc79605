//! Peers grouped by address prefix, for limits: one host of a network an attacker controls
//! is one address, but the attacker has the whole prefix (127.0.0.0/8 is all loopback on Linux,
//! and a routed IPv6 /64 is one customer). Caps and throttles that count per address alone are
//! lifted by rotating source addresses; counting per prefix as well is not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How peers are grouped: the leading bits of an address that name its network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixLen {
    /// Bits of an IPv4 address (and of an IPv4-mapped IPv6 address), 0 to 32.
    pub v4: u8,
    /// Bits of an IPv6 address, 0 to 128.
    pub v6: u8,
}

impl Default for PrefixLen {
    /// /24 for IPv4 (a typical allocation to one site), /64 for IPv6 (one subnet: hosts pick
    /// the low 64 bits themselves).
    fn default() -> Self {
        PrefixLen { v4: 24, v6: 64 }
    }
}

impl PrefixLen {
    /// The network `ip` belongs to: its address with the bits below the prefix cleared
    /// (IPv4-mapped IPv6 addresses are taken as the IPv4 address they carry).
    pub fn prefix_of(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(a) => IpAddr::V4(mask_v4(a, self.v4)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(mask_v4(v4, self.v4)),
                None => {
                    let bits = u32::from(self.v6.min(128));
                    let m = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                    IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
                }
            },
        }
    }

    /// How a prefix is shown: `127.0.3.0/24`.
    pub fn show(&self, prefix: IpAddr) -> String {
        match prefix {
            IpAddr::V4(_) => format!("{prefix}/{}", self.v4),
            IpAddr::V6(_) => format!("{prefix}/{}", self.v6),
        }
    }
}

fn mask_v4(a: Ipv4Addr, bits: u8) -> Ipv4Addr {
    let bits = u32::from(bits.min(32));
    let m = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    Ipv4Addr::from(u32::from(a) & m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_group_addresses_of_one_network() {
        let p = PrefixLen::default();
        let v4 = |s: &str| p.prefix_of(s.parse().expect("ip"));
        assert_eq!(v4("127.0.3.77"), v4("127.0.3.1"));
        assert_ne!(v4("127.0.3.77"), v4("127.0.4.77"));
        assert_eq!(v4("::ffff:127.0.3.77"), v4("127.0.3.9"));
        assert_eq!(p.show(v4("10.1.2.3")), "10.1.2.0/24");
        assert_eq!(v4("2001:db8:1:2:aaaa::1"), v4("2001:db8:1:2::ffff"));
        assert_ne!(v4("2001:db8:1:2::1"), v4("2001:db8:1:3::1"));
        let all = PrefixLen { v4: 0, v6: 0 };
        assert_eq!(
            all.prefix_of("1.2.3.4".parse().expect("ip")),
            all.prefix_of("9.9.9.9".parse().expect("ip"))
        );
        let one = PrefixLen { v4: 32, v6: 128 };
        assert_ne!(
            one.prefix_of("1.2.3.4".parse().expect("ip")),
            one.prefix_of("1.2.3.5".parse().expect("ip"))
        );
    }
}
