package fleet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// DeliverFunc delivers one owned partition: it reads with p.Next until
// that returns ErrLost (or ctx ends) and acknowledges what is done. ctx ends
// when ownership ends (lease lost, given up, Run stopping); the function
// must then stop sending at once and return. Its error is logged.
type DeliverFunc func(ctx context.Context, p *Partition) error

// slot is one partition of one lane kind's stream.
type slot struct {
	kind storage.Kind
	id   int
}

func (s slot) key() string { return "p." + s.kind.String() + "." + strconv.Itoa(s.id) }

// label is the slot's metric label, e.g. "events-3".
func (s slot) label() string { return s.kind.String() + "-" + strconv.Itoa(s.id) }

// lease is a partition this relay holds.
type lease struct {
	p      atomic.Pointer[Partition] // set once open
	rev    uint64
	cancel context.CancelFunc
	timer  *time.Timer // cancels at the lease's deadline
	// until is the lease's deadline, read by the clock before each send
	// (storage.Leased): the timer's cancellation may come after a resumed
	// process already sent.
	until atomic.Pointer[time.Time]
	done  chan struct{}
	// refused is set when a renewal was refused: the lease is another's
	// or gone, so it is neither renewed nor released again.
	refused bool
}

func (l *lease) held() bool { return time.Now().Before(*l.until.Load()) }

// Run takes part in the fleet until ctx ends (it returns nil) or the
// connection is closed (it returns an error): it keeps this relay's
// membership alive, holds the leases of the partitions assigned to it and
// runs deliver for each (see the package documentation, Ownership). It
// returns after every deliver call returned and the leases and membership
// were given up, so that the other relays take over at once.
func (f *Fleet) Run(ctx context.Context, deliver DeliverFunc) error {
	return f.run(ctx, kinds, deliver)
}

// run is Run over the partitions of ks only. Several may run at once (one
// per lane kind's delivery): the assignment is per kind, so each computes
// the same spread as one over every kind would.
func (f *Fleet) run(ctx context.Context, ks []storage.Kind, deliver DeliverFunc) error {
	var slots []slot
	for _, k := range ks {
		for i := range f.cfg.Partitions {
			slots = append(slots, slot{k, i})
		}
	}
	held := make([]*lease, len(slots)) // by slot index; each tick's goroutine i touches held[i] only
	var members map[storage.Kind][]string
	tick := time.NewTicker(f.cfg.LeaseTTL / 3)
	defer tick.Stop()
	for {
		// The held leases are renewed first, beside the heartbeat and the
		// members' list (which run beside each other): had a renewal to
		// wait for those (each may take opCtx), a loaded cluster's slow
		// answers would eat the lease's margin, and its relays would give
		// their partitions up and read them again.
		var wg sync.WaitGroup
		wg.Go(func() { f.heartbeat(ctx, ks) })
		renewing := make([]bool, len(slots))
		for i, l := range held {
			// A deliver that returned keeps its lease (its partition
			// unsent) while a pause this relay got is not in the bucket
			// yet, until it is or it ends.
			if l != nil && ctx.Err() == nil && (!isDone(l.done) || !l.refused && f.pause.unwritten()) {
				renewing[i] = true
				wg.Go(func() { f.renew(ctx, slots[i], l) })
			}
		}
		if m, err := f.members(ctx); err == nil {
			members = m
			for _, k := range ks {
				f.compress[k].Store(uint32(f.codecOf(ctx, k, m[k])))
			}
		} else if ctx.Err() == nil {
			f.log.Warn("list fleet members; keeping the last list", zap.Error(err))
		}
		// Each kind is spread over the relays that deliver it (a relay
		// may run some kinds only, or stop one kind's delivery first).
		owners := make([]string, len(slots))
		for _, k := range ks {
			var idx []int
			var kslots []slot
			for i, s := range slots {
				if s.kind == k {
					idx, kslots = append(idx, i), append(kslots, s)
				}
			}
			for j, o := range assign(kslots, members[k], f.cfg.Name) {
				owners[idx[j]] = o
			}
		}
		// One goroutine per slot with something to do, so that a slow
		// answer for one lease does not delay the others.
		for i, s := range slots {
			want := owners[i] == f.cfg.Name
			l := held[i]
			switch {
			case ctx.Err() != nil:
			case renewing[i]:
				// The renewal in flight owns l.rev and l.refused: a
				// lease to give up is released at a later tick.
				if !want {
					l.cancel()
				}
			case l != nil && isDone(l.done):
				// deliver returned (lost, given up, or on its own).
				held[i] = nil
				wg.Go(func() { f.release(s, l) })
			case l != nil && !want:
				l.cancel() // released once deliver returned
			case l == nil && want:
				wg.Go(func() { held[i] = f.acquire(ctx, s, deliver) })
			}
		}
		wg.Wait()
		if f.nc.IsClosed() {
			// Closed for good (a connection reconnects otherwise): the
			// leases are lost with it.
			f.stopAll(slots, held)
			return fmt.Errorf("fleet: run: %w", ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			f.stopAll(slots, held)
			return nil
		case <-tick.C:
		}
	}
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// opCtx bounds one KV operation of the ownership loop.
func (f *Fleet) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.cfg.LeaseTTL/4)
}

// memberKey is this relay's membership key for kind k: a relay is a member
// of each kind it delivers (each kind's delivery runs its own
// Run).
func (f *Fleet) memberKey(k storage.Kind) string { return "m." + k.String() + "." + f.cfg.Name }

// reads ends a membership value (a heartbeat's time) of a relay that reads
// compressed messages: zstd (codec version 3) and S2 (version 2). A relay
// of before writes the time alone (it reads neither) or the time and
// readsS2 (it reads S2 only), and would dead-letter a message of a version
// it does not read as damaged: the committers of a kind write only what
// every member of it reads (codecOf), so that a rolling upgrade loses
// nothing. reads ends with readsS2, so that a relay reading S2 only sees
// that this one reads S2.
const (
	readsS2   = " reads=s2"
	readsZstd = " reads=zstd"
	reads     = readsZstd + readsS2
)

func (f *Fleet) heartbeat(ctx context.Context, ks []storage.Kind) {
	octx, cancel := f.opCtx(ctx)
	defer cancel()
	for _, k := range ks {
		if _, err := f.kv.Put(octx, f.memberKey(k), []byte(time.Now().UTC().Format(time.RFC3339)+reads)); err != nil && ctx.Err() == nil {
			f.log.Warn("fleet heartbeat", zap.Error(err))
			return
		}
	}
}

// members lists the live members' names of each kind, sorted.
func (f *Fleet) members(ctx context.Context) (map[storage.Kind][]string, error) {
	octx, cancel := f.opCtx(ctx)
	defer cancel()
	kl, err := f.kv.ListKeysFiltered(octx, "m.*.*")
	if err != nil {
		return nil, err
	}
	defer kl.Stop() //nolint:errcheck // nothing to do
	ms := make(map[storage.Kind][]string)
	for key := range kl.Keys() {
		kind, name, ok := strings.Cut(strings.TrimPrefix(key, "m."), ".")
		if !ok {
			continue
		}
		for _, k := range kinds {
			if k.String() == kind {
				ms[k] = append(ms[k], name)
			}
		}
	}
	for _, names := range ms {
		slices.Sort(names)
	}
	return ms, nil
}

// codecOf is the codec version the committers of kind k write: the best
// that every member of it (names, this relay among them or not yet listed)
// reads; codecPlain when a membership cannot be read. A relay of before
// that joins later reads the messages written meanwhile as damaged until
// the others' next heartbeat: a downgrade, which needs a drain (see the
// README).
func (f *Fleet) codecOf(ctx context.Context, k storage.Kind, names []string) byte {
	octx, cancel := f.opCtx(ctx)
	defer cancel()
	codec := byte(codecZstd)
	for _, name := range names {
		e, err := f.kv.Get(octx, "m."+k.String()+"."+name)
		if err != nil {
			return codecPlain
		}
		v := string(e.Value())
		switch {
		case strings.HasSuffix(v, reads):
		case strings.HasSuffix(v, readsS2):
			codec = codecS2
		default:
			return codecPlain
		}
	}
	return codec
}

// assign maps each slot to a member: rendezvous hashing (highest
// FNV-1a(member, slot) first) with bounded load, so that each member takes
// at most ceil(P/n) partitions of each kind (spread) and a membership
// change moves few of them (stable). self is counted as a member even when
// its heartbeat is not listed yet. Every relay computes the same map from
// the same list.
func assign(slots []slot, members []string, self string) []string {
	if !slices.Contains(members, self) {
		members = append(slices.Clone(members), self)
		slices.Sort(members)
	}
	perKind := make(map[storage.Kind]int)
	for _, s := range slots {
		perKind[s.kind]++
	}
	load := make(map[storage.Kind]map[string]int)
	out := make([]string, len(slots))
	type cand struct {
		m     string
		score uint64
	}
	cands := make([]cand, len(members))
	for i, s := range slots {
		limit := (perKind[s.kind] + len(members) - 1) / len(members)
		if load[s.kind] == nil {
			load[s.kind] = make(map[string]int)
		}
		for j, m := range members {
			h := fnv.New64a()
			h.Write([]byte(m))
			h.Write([]byte{0})
			h.Write([]byte(s.key()))
			cands[j] = cand{m, h.Sum64()}
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if a.score != b.score {
				if a.score > b.score {
					return -1
				}
				return 1
			}
			return strings.Compare(a.m, b.m)
		})
		for _, c := range cands {
			if load[s.kind][c.m] < limit {
				load[s.kind][c.m]++
				out[i] = c.m
				break
			}
		}
	}
	return out
}

// acquire takes a free lease, resets the partition's consumer and starts
// deliver; nil when the lease is held by another relay or the cluster did
// not answer.
func (f *Fleet) acquire(ctx context.Context, s slot, deliver DeliverFunc) *lease {
	start := time.Now()
	octx, cancel := f.opCtx(ctx)
	rev, err := f.kv.Create(octx, s.key(), []byte(f.cfg.Name))
	cancel()
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			f.log.Warn("take partition lease", zap.String("partition", s.key()), zap.Error(err))
		}
		return nil
	}
	owned, stop := context.WithCancel(ctx)
	l := &lease{rev: rev, cancel: stop, done: make(chan struct{})}
	until := start.Add(f.cfg.LeaseTTL - f.cfg.LeaseMargin)
	l.until.Store(&until)
	owned = storage.WithLease(owned, l.held)
	l.timer = time.AfterFunc(f.deadline(start), stop)
	// Opening (the consumer's reset) and delivering run beside the loop,
	// which goes on renewing the lease; when opening fails, done closes
	// and the next tick releases the lease.
	go func() {
		defer close(l.done)
		// The pauses as stored now, before anything is sent: the previous
		// owner's 429s hold here too, whatever the watcher has seen yet.
		// Nothing is sent until the bucket could be read.
		for {
			octx, cancel := f.opCtx(owned)
			err := f.pause.load(octx)
			cancel()
			if err == nil {
				break
			}
			if owned.Err() != nil {
				return
			}
			f.log.Warn("read the pauses before taking a partition", zap.String("partition", s.key()), zap.Error(err))
			select {
			case <-owned.Done():
				return
			case <-time.After(f.cfg.LeaseTTL / 12):
			}
		}
		p, err := f.openPartition(owned, owned, s.kind, s.id)
		if err != nil {
			if owned.Err() == nil {
				f.log.Warn("open partition", zap.String("partition", s.key()), zap.Error(err))
			}
			return
		}
		defer p.close()
		l.p.Store(p)
		f.m.owned.Add(1)
		defer f.m.owned.Add(-1)
		defer f.m.backlog.DeleteLabelValues(s.label())
		f.log.Info("partition taken", zap.String("partition", s.key()))
		if err := deliver(owned, p); err != nil && !errors.Is(err, ErrLost) && owned.Err() == nil {
			f.log.Error("deliver partition", zap.String("partition", s.key()), zap.Error(err))
		}
	}()
	return l
}

// deadline is how long after now a lease renewed (or created) at start
// may be used.
func (f *Fleet) deadline(start time.Time) time.Duration {
	return f.cfg.LeaseTTL - f.cfg.LeaseMargin - time.Since(start)
}

// renew extends a held lease; on refusal (another relay holds it, or it
// expired) or when its deadline already passed, ownership ends at once.
func (f *Fleet) renew(ctx context.Context, s slot, l *lease) {
	start := time.Now()
	octx, cancel := f.opCtx(ctx)
	rev, err := f.kv.Update(octx, s.key(), []byte(f.cfg.Name), l.rev)
	err = f.atLanded(octx, s, err, func(r uint64) (err error) {
		rev, err = f.kv.Update(octx, s.key(), []byte(f.cfg.Name), r)
		return err
	})
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			f.log.Warn("renew partition lease", zap.String("partition", s.key()), zap.Error(err))
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) {
			l.refused = true
			l.cancel() // refused: someone else has it, stop now
		}
		return // otherwise the deadline decides
	}
	l.rev = rev
	// The deadline before the timer: a sender must never see the lease
	// run out while the timer, extended, will not end it.
	until := start.Add(f.cfg.LeaseTTL - f.cfg.LeaseMargin)
	l.until.Store(&until)
	if !l.timer.Reset(f.deadline(start)) {
		l.cancel() // the deadline passed before this renewal: stay stopped
		return
	}
	if p := l.p.Load(); p != nil {
		octx, cancel := f.opCtx(ctx)
		info, err := p.cons.Info(octx)
		cancel()
		if err == nil {
			f.m.backlog.WithLabelValues(s.label()).Set(float64(info.NumPending + uint64(info.NumAckPending)))
		}
	}
}

// release gives a lease up once its deliver returned. It is worth asking
// until the lease would expire on the cluster by itself (until plus the
// margin): on a loaded cluster a delete can take longer than a fixed
// fraction of the TTL, and a lease not handed over waits out its TTL.
func (f *Fleet) release(s slot, l *lease) {
	l.timer.Stop()
	l.cancel()
	ctx, cancel := context.WithDeadline(context.Background(), l.until.Load().Add(f.cfg.LeaseMargin))
	defer cancel()
	err := f.kv.Delete(ctx, s.key(), jetstream.LastRevision(l.rev))
	err = f.atLanded(ctx, s, err, func(r uint64) error {
		return f.kv.Delete(ctx, s.key(), jetstream.LastRevision(r))
	})
	if err != nil {
		// It expires by itself.
		f.log.Debug("release partition lease", zap.String("partition", s.key()), zap.Error(err))
		return
	}
	f.log.Info("partition released", zap.String("partition", s.key()))
}

// atLanded retries op, a write of s's lease that failed with err, at the
// lease's current revision while the lease still holds this relay's name:
// a renewal whose answer came too late (its context ended after the
// cluster applied it) moved the revision past l.rev, yet the lease is this
// relay's, for no other relay writes this name. Without it the next
// renewal and the release would be refused, and the partition would wait
// out its TTL with nobody delivering it. A bucket's reads are direct gets,
// which a replica that has not applied the last write yet may answer: a
// revision read there is refused too, so it is read again until ctx ends.
func (f *Fleet) atLanded(ctx context.Context, s slot, err error, op func(rev uint64) error) error {
	for err != nil && ctx.Err() == nil {
		e, gerr := f.kv.Get(ctx, s.key())
		if gerr != nil || string(e.Value()) != f.cfg.Name {
			return err
		}
		if err = op(e.Revision()); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return err
}

// stopAll ends every deliver, waits for them and gives up the leases
// (unless a pause is not stored yet) and the membership.
func (f *Fleet) stopAll(slots []slot, held []*lease) {
	for _, l := range held {
		if l != nil {
			l.cancel()
		}
	}
	for _, l := range held {
		if l != nil {
			<-l.done
		}
	}
	// A pause this relay got and could not store yet: a moment for the
	// rewrite; then, if it is still not stored, the leases are left to
	// expire (LeaseTTL) rather than handed over at once.
	for i := 0; i < 50 && f.pause.unwritten(); i++ {
		time.Sleep(f.cfg.LeaseTTL / 100)
	}
	keep := f.pause.unwritten()
	var wg sync.WaitGroup
	for i, l := range held {
		switch {
		case l == nil:
		case keep:
			l.timer.Stop()
		default:
			wg.Go(func() { f.release(slots[i], l) })
		}
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.LeaseTTL/4)
	defer cancel()
	for _, s := range slots {
		if s.id == 0 { // once per kind
			if err := f.kv.Delete(ctx, f.memberKey(s.kind)); err != nil {
				f.log.Debug("leave fleet", zap.Error(err))
			}
		}
	}
}
