package ingest

import (
	"net/netip"
	"strings"
)

// IP anonymization (issue 23).

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
	if len(ip) > 64 { // longer than any address with a zone
		return append(dst, jsonNull...)
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(ip)))
	if err != nil {
		return append(dst, jsonNull...)
	}
	dst = append(dst, '"')
	dst = anonymizeAddr(a).AppendTo(dst)
	return append(dst, '"')
}
