package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// The waits between attempts of FlushDead.
const (
	DeadRetryInitial = 100 * time.Millisecond
	DeadRetryMax     = 10 * time.Second
)

// FlushDead is the dead-letter flush of every kind: it commits dls to w,
// retrying a failed commit with backoff until it succeeds, so that the
// records are done before their chunk is acknowledged. failed, when not
// nil, is called with the first error only. It returns nil once the dead
// letters are durable; an error when ctx ends or the store is gone
// (storage.ErrLost): then nothing may be acknowledged.
func FlushDead(ctx context.Context, w storage.DeadWriter, dls []storage.DeadLetter, failed func(error)) error {
	var bo *Retry // made on the first failure: the common case allocates nothing
	for {
		err := w.PutDead(ctx, dls)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, storage.ErrLost) {
			return fmt.Errorf("store dead letters: %w", err)
		}
		if bo == nil {
			bo = NewRetry(DeadRetryInitial, DeadRetryMax)
			if failed != nil {
				failed(err)
			}
		}
		if !sleep(ctx, bo.Next()) {
			return fmt.Errorf("store dead letters: %w (then %w)", err, ctx.Err())
		}
	}
}
