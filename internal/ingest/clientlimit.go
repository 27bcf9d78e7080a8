package ingest

import (
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"time"
)

// Per-client rate limits.
//
// A token bucket per client, kept as GCRA's theoretical arrival time (one
// int64): a client may send while its tat is at most burst intervals ahead
// of now, and each request moves tat one interval on. A fresh client, or one
// idle long enough, has a full bucket of burst requests.
//
// The table is fixed: limiterShards shards of slotsPerShard slots, each slot
// 24 bytes (the client key and its tat), allocated once when the limit is
// on. A client hashes (seeded at random per Server, so nobody can aim at
// another's slots) to one set of limiterWays slots in one shard; a client not
// in its set takes the set's slot whose tat is oldest, the client whose
// bucket is fullest. A forgotten client starts again with a full bucket: under
// table pressure the limit errs towards letting requests through, and never
// refuses one client because of another.

const (
	limiterShards     = 64
	limiterWays       = 4
	slotsPerShard     = 1024
	limiterMaxClients = limiterShards * slotsPerShard
)

// limiterSlot is one client's bucket; tat 0 means free.
type limiterSlot struct {
	key [16]byte // the client's address (IPv6: its /64), 16-byte form
	tat int64    // theoretical arrival time, ns since limiter.base
}

type limiterShard struct {
	mu    sync.Mutex
	slots []limiterSlot // sets of limiterWays consecutive slots
	_     [32]byte      // keep shards' mutexes on separate cache lines
}

// clientLimiter is a fixed-size table of token buckets, keyed by client
// address. Lock order: one shard's mu at a time, no call out under it.
type clientLimiter struct {
	interval int64 // ns per request
	burst    int64 // ns of tolerance: burst requests' intervals
	seed     maphash.Seed
	base     time.Time
	now      func() time.Time
	sets     uint64 // sets per shard
	shards   [limiterShards]limiterShard
}

// newClientLimiter returns a limiter of rate requests per second per client
// with a burst of twice that (at least one request), holding
// slots (a multiple of limiterShards*limiterWays) clients.
func newClientLimiter(rate float64, slots int, now func() time.Time) *clientLimiter {
	interval := int64(math.Ceil(float64(time.Second) / rate))
	interval = max(interval, 1)
	burstReqs := max(math.Floor(2*rate), 1)
	l := &clientLimiter{
		interval: interval,
		burst:    int64(burstReqs * float64(interval)),
		seed:     maphash.MakeSeed(),
		now:      now,
		sets:     uint64(slots / limiterShards / limiterWays),
	}
	l.base = now()
	for i := range l.shards {
		l.shards[i].slots = make([]limiterSlot, slots/limiterShards)
	}
	return l
}

// limiterKey is the table key of a client address: an IPv4 address as
// such, an IPv6 address by its /64 (one subscriber's usual share, which a
// client could otherwise cycle through).
func limiterKey(a netip.Addr) [16]byte {
	a = a.Unmap()
	k := a.As16()
	if a.Is6() {
		clear(k[8:])
	}
	return k
}

// locate returns the shard and the index of the first slot of key's set.
func (l *clientLimiter) locate(key [16]byte) (*limiterShard, int) {
	h := maphash.Comparable(l.seed, key)
	return &l.shards[h%limiterShards], int((h / limiterShards) % l.sets * limiterWays)
}

// allow takes one request of client a from its bucket. When the bucket is
// empty it returns false and how long until the request would be taken.
func (l *clientLimiter) allow(a netip.Addr) (bool, time.Duration) {
	key := limiterKey(a)
	sh, set := l.locate(key)
	now := int64(l.now().Sub(l.base)) + 1 // > 0: 0 marks a free slot

	sh.mu.Lock()
	ways := sh.slots[set : set+limiterWays]
	slot := &ways[0]
	for i := range ways {
		w := &ways[i]
		if w.tat != 0 && w.key == key {
			slot = w
			break
		}
		if w.tat < slot.tat { // free (0) or fuller: the victim so far
			slot = w
		}
	}
	if slot.key != key || slot.tat == 0 {
		slot.key, slot.tat = key, now
	}
	tat := max(slot.tat, now) + l.interval
	if wait := tat - now - l.burst; wait > 0 {
		sh.mu.Unlock()
		return false, time.Duration(wait)
	}
	slot.tat = tat
	sh.mu.Unlock()
	return true, 0
}
