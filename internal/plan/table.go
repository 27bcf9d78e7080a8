package plan

import "hash/maphash"

// table is a read-only map from string keys, built once per plan and looked
// up with the record's bytes: open addressing at most half full, the full
// hash kept beside each key so that a probe compares bytes only on a hash
// match. A lookup costs one maphash of the key and, for a key the plan
// names, one comparison: a third of a Go map's on the check's keys.
type table[V any] struct {
	seed maphash.Seed
	mask uint64
	hs   []uint64 // 0: empty (a key hashing to 0 is stored as 1)
	keys []string
	vals []V
	n    int
}

func newTable[V any](n int) *table[V] {
	size := 8
	for size < 2*n {
		size *= 2
	}
	return &table[V]{seed: maphash.MakeSeed(), mask: uint64(size - 1),
		hs: make([]uint64, size), keys: make([]string, size), vals: make([]V, size)}
}

func (t *table[V]) hash(k []byte) uint64 {
	if h := maphash.Bytes(t.seed, k); h != 0 {
		return h
	}
	return 1
}

// put sets k's value (a later put of k replaces it). n puts may follow
// newTable(n).
func (t *table[V]) put(k string, v V) {
	h := t.hash([]byte(k))
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		switch {
		case t.hs[i] == 0:
			if 2*(t.n+1) > len(t.hs) {
				panic("plan: table overfull")
			}
			t.hs[i], t.keys[i], t.vals[i] = h, k, v
			t.n++
			return
		case t.hs[i] == h && t.keys[i] == k:
			t.vals[i] = v
			return
		}
	}
}

// get returns k's value, ok false when k is not in t.
func (t *table[V]) get(k []byte) (v V, ok bool) {
	h := t.hash(k)
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		switch t.hs[i] {
		case 0:
			return v, false
		case h:
			if t.keys[i] == string(k) {
				return t.vals[i], true
			}
		}
	}
}

// each calls f with each key and value, in no order.
func (t *table[V]) each(f func(string, V)) {
	for i, h := range t.hs {
		if h != 0 {
			f(t.keys[i], t.vals[i])
		}
	}
}
