package event

import (
	"strings"
	"testing"
)

// MaxEnvelopeOverhead is an upper bound of EnvelopeOverhead for every
// api_key, the ones encoding/json escapes included.
func TestMaxEnvelopeOverheadBounds(t *testing.T) {
	for _, k := range []string{
		"", "key", "b3nch000000000000000000000000000",
		"<&>", "\x00\x01\x1f", "\"\\", "\xff\xfe", "\u2028\u2029", "é",
		strings.Repeat("<", 100), strings.Repeat("\x80", 100),
	} {
		for _, o := range [][]byte{nil, []byte(`{"min_id_length":3}`)} {
			exact, bound := EnvelopeOverhead(k, o), MaxEnvelopeOverhead(len(k), o)
			if bound < exact {
				t.Errorf("api_key %q options %s: bound %d < exact %d", k, o, bound, exact)
			}
		}
	}
}

func FuzzMaxEnvelopeOverhead(f *testing.F) {
	f.Add("key", []byte(`{"min_id_length":3}`))
	f.Add("<\x00\xff\u2028", []byte(nil))
	f.Fuzz(func(t *testing.T, k string, o []byte) {
		if exact, bound := EnvelopeOverhead(k, o), MaxEnvelopeOverhead(len(k), o); bound < exact {
			t.Errorf("api_key %q: bound %d < exact %d", k, bound, exact)
		}
	})
}
