package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/storage"
)

// deadJSON is a dead letter as stored in RELAY_DEAD.
type deadJSON struct {
	Kind     uint8     `json:"kind"`
	APIKey   string    `json:"api_key"`
	Options  string    `json:"options,omitempty"`
	Reason   string    `json:"reason"`
	Answer   []byte    `json:"answer,omitempty"`
	Accepted time.Time `json:"accepted"`
	Died     time.Time `json:"died"`
	OrderKey []byte    `json:"order_key,omitempty"`
	UserID   []byte    `json:"user_id,omitempty"`
	Data     []byte    `json:"data"`
}

// PutDead stores dead letters and returns once each is stored on a quorum;
// it sets their IDs (stream sequences, increasing, never reused). A call
// retried with the same dead letters within the dedup window stores them
// once (the message id is a hash of the content).
func (f *Fleet) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	for i := range dls {
		d := &dls[i]
		body, err := json.Marshal(deadJSON{
			Kind: uint8(d.Lane.Kind), APIKey: d.Lane.APIKey, Options: d.Lane.Options,
			Reason: d.Reason, Answer: d.Answer, Accepted: d.Accepted, Died: d.Died,
			OrderKey: d.Record.OrderKey, UserID: d.Record.UserID, Data: d.Record.Data,
		})
		if err != nil {
			return fmt.Errorf("fleet: encode dead letter: %w", err)
		}
		sum := sha256.Sum256(body)
		msg := &nats.Msg{Subject: f.n.deadSubject(d.Lane.Kind), Data: body}
		for {
			ack, err := f.js.PublishMsg(ctx, msg, jetstream.WithMsgID(hex.EncodeToString(sum[:16])), jetstream.WithExpectStream(f.n.deadStream()))
			if err == nil {
				d.ID = ack.Sequence
				break
			}
			if !retryable(err) || ctx.Err() != nil {
				return fmt.Errorf("fleet: put dead letter: %w", unavailable(err))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("fleet: put dead letter: %w", unavailable(errors.Join(err, ctx.Err())))
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// ListDead returns up to limit dead letters with ID > after that match
// filter, by ID; limit <= 0 means 1000. Any relay lists every relay's dead
// letters.
func (f *Fleet) ListDead(ctx context.Context, filter storage.DeadFilter, after uint64, limit int) ([]storage.DeadLetter, error) {
	if limit <= 0 {
		limit = 1000
	}
	subj := f.n.deadAll()
	if filter.Lane != nil {
		subj = f.n.deadSubject(filter.Lane.Kind)
	}
	var out []storage.DeadLetter
	for seq := after + 1; len(out) < limit; {
		m, err := f.dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: list dead letters: %w", unavailable(err))
		}
		seq = m.Sequence + 1
		var d deadJSON
		if err := json.Unmarshal(m.Data, &d); err != nil {
			return nil, fmt.Errorf("fleet: dead letter %d: %w", m.Sequence, err)
		}
		dl := storage.DeadLetter{
			ID:     m.Sequence,
			Lane:   storage.LaneKey{Kind: storage.Kind(d.Kind), APIKey: d.APIKey, Options: d.Options},
			Reason: d.Reason, Answer: d.Answer, Accepted: d.Accepted, Died: d.Died,
			Record: storage.Record{OrderKey: d.OrderKey, UserID: d.UserID, Data: d.Data},
		}
		if (filter.Lane != nil && dl.Lane != *filter.Lane) || (filter.Reason != "" && dl.Reason != filter.Reason) ||
			(filter.Label != "" && dl.Lane.Label() != filter.Label) {
			continue
		}
		out = append(out, dl)
	}
	return out, nil
}

// DeleteDead removes the dead letters with the given ids; unknown ids are
// ignored.
func (f *Fleet) DeleteDead(ctx context.Context, ids []uint64) error {
	for _, id := range ids {
		err := f.dead.DeleteMsg(ctx, id)
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		// The server's answer for an id past the end is not "not found":
		// ask whether the message is there.
		if _, gerr := f.dead.GetMsg(ctx, id); errors.Is(gerr, jetstream.ErrMsgNotFound) {
			continue
		}
		return fmt.Errorf("fleet: delete dead letter %d: %w", id, unavailable(err))
	}
	return nil
}

// DeadCount is the number of dead letters stored (every relay's).
func (f *Fleet) DeadCount(ctx context.Context) (int64, error) {
	info, err := f.dead.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("fleet: count dead letters: %w", unavailable(err))
	}
	return int64(info.State.Msgs), nil
}
