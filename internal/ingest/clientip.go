package ingest

import (
	"bytes"
	"net/netip"
)

// clientAddr returns the client's address: peer, or, when peer is a trusted
// proxy, the rightmost address of the X-Forwarded-For values xff (in header
// order) that is not trusted; the walk also stops at the first entry that is
// not an address, keeping the last address reached. See the package
// documentation.
func clientAddr(peer netip.Addr, xff [][]byte, trusted []netip.Prefix) netip.Addr {
	addr := peer.Unmap()
	if !isTrusted(addr, trusted) {
		return addr
	}
	for h := len(xff) - 1; h >= 0; h-- {
		v := xff[h]
		for len(v) > 0 {
			var entry []byte
			if i := bytes.LastIndexByte(v, ','); i >= 0 {
				entry, v = v[i+1:], v[:i]
			} else {
				entry, v = v, nil
			}
			entry = bytes.Trim(entry, " \t")
			if len(entry) == 0 {
				continue
			}
			a, ok := parseForwardedAddr(entry)
			if !ok {
				return addr
			}
			addr = a
			if !isTrusted(addr, trusted) {
				return addr
			}
		}
	}
	return addr
}

// parseForwardedAddr parses one X-Forwarded-For entry: an IPv4 or IPv6
// address, optionally with a port ("1.2.3.4:80", "[::1]:80"). The zone of an
// IPv6 address is dropped.
func parseForwardedAddr(b []byte) (netip.Addr, bool) {
	if len(b) > 64 { // longer than any address with port and zone
		return netip.Addr{}, false
	}
	s := string(b)
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), true
}

// isTrusted reports whether a is in one of the prefixes trusted.
func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
