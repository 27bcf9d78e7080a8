package event

import (
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
)

// IDGen generates insert_ids that are unique across processes and restarts
// (a random per-generator prefix plus a counter). Safe for concurrent use.
//
// An id is 16 lower-case hex digits of a 64-bit crypto-random prefix, chosen
// once by NewIDGen, followed by a per-generator counter (starting at 1) in
// lower-case hex without leading zeros: "9f3a1c2b4d5e6f70" + "1a". The prefix
// has a fixed width, so different (prefix, counter) pairs never render the
// same id. Ids are 17 to 32 bytes long, well under the 1024-character limit.
// The zero IDGen is not usable: Append panics on it.
type IDGen struct {
	prefix [16]byte
	n      atomic.Uint64
}

// NewIDGen returns a generator with a fresh random prefix.
func NewIDGen() *IDGen {
	var r [8]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails (it crashes the program instead)
	g := &IDGen{}
	hex.Encode(g.prefix[:], r[:])
	return g
}

// Append appends a new unique insert_id (no quotes) to dst.
func (g *IDGen) Append(dst []byte) []byte {
	if g.prefix[0] == 0 {
		panic("event: IDGen not made by NewIDGen")
	}
	n := g.n.Add(1)
	dst = append(dst, g.prefix[:]...)
	var buf [16]byte
	i := len(buf)
	for {
		i--
		buf[i] = "0123456789abcdef"[n&15]
		if n >>= 4; n == 0 {
			break
		}
	}
	return append(dst, buf[i:]...)
}
