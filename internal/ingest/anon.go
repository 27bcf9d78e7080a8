package ingest

import (
	"bytes"
	"net/netip"
)

// IP anonymization.

// anonymizeAddr drops the host part of a: the last octet of an IPv4 address
// (a /24 is kept), the last 80 bits of an IPv6 address (a /48 is kept). An
// IPv4-mapped IPv6 address is treated as the IPv4 address it maps; the zone
// is dropped.
func anonymizeAddr(a netip.Addr) netip.Addr {
	a = a.Unmap().WithZone("")
	bits := 24
	if a.Is6() {
		bits = 48
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return netip.Addr{}
	}
	return p.Addr()
}

var jsonNull = []byte("null")

// appendAnonymizedIP is the event.AppendIPsReplaced replacement for an ip
// a client gave: the anonymized address as a JSON string, or null when the
// value is not an IP address (it cannot be anonymized, so it is not
// forwarded; the upstream takes a null ip as absent).
func appendAnonymizedIP(dst, ip []byte) []byte {
	ip = bytes.TrimSpace(ip)
	a, ok := parseIPv4(ip) // without the allocation of string(ip)
	if !ok {
		if len(ip) > 64 { // longer than any address with a zone
			return append(dst, jsonNull...)
		}
		var err error
		if a, err = netip.ParseAddr(string(ip)); err != nil {
			return append(dst, jsonNull...)
		}
	}
	dst = append(dst, '"')
	dst = anonymizeAddr(a).AppendTo(dst)
	return append(dst, '"')
}

// parseIPv4 parses a dotted-quad IPv4 address as netip.ParseAddr does (four
// decimal fields of 0..255, no leading zeros).
func parseIPv4(b []byte) (netip.Addr, bool) {
	var a [4]byte
	field, n, digits := 0, 0, 0
	for i, c := range b {
		switch {
		case c >= '0' && c <= '9':
			if digits > 0 && n == 0 { // leading zero
				return netip.Addr{}, false
			}
			n = n*10 + int(c-'0')
			digits++
			if n > 255 {
				return netip.Addr{}, false
			}
		case c == '.' && digits > 0 && field < 3 && i < len(b)-1:
			a[field] = byte(n)
			field, n, digits = field+1, 0, 0
		default:
			return netip.Addr{}, false
		}
	}
	if field != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	a[3] = byte(n)
	return netip.AddrFrom4(a), true
}
