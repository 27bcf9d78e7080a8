package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/storage"
)

// ErrFull is returned by Append when the lane kind's stream is at its
// MaxBytes (or the cluster has no room left): nothing of the request was
// stored. The ingest answers 503 with Retry-After. It matches
// storage.ErrFull.
var ErrFull error = &seamError{"fleet: stream full", storage.ErrFull}

// ErrUnavailable is returned when the cluster did not answer in time (no
// quorum, no leader, connection lost) after the retries Append or another
// operation allows itself. For Append, the request may or may not be stored
// (see the package documentation, Ingest); the ingest answers 503 with
// Retry-After. It matches storage.ErrUnavailable.
var ErrUnavailable error = &seamError{"fleet: cluster unavailable", storage.ErrUnavailable}

// ErrPartitions is returned by Open when an existing stream was created
// with another number of partitions (or message format) than configured:
// changing P would move keys between partitions and break their order.
var ErrPartitions = errors.New("fleet: partition count mismatch")

// ErrLost is returned by a Partition's methods once this relay no longer
// owns the partition. It matches storage.ErrLost.
var ErrLost error = &seamError{"fleet: partition ownership lost", storage.ErrLost}

// seamError is a sentinel of this package that also matches the storage
// seam's sentinel of the same meaning (errors.Is).
type seamError struct {
	msg  string
	seam error
}

func (e *seamError) Error() string { return e.msg }

func (e *seamError) Is(target error) bool { return target == e.seam }

// unavailable wraps the errors that mean "the cluster did not answer" with
// ErrUnavailable, leaving others as they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	if retryable(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// retryable reports errors after which the same request may succeed.
func retryable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.Code == 408 || apiErr.Code == 429 || apiErr.ErrorCode == errCodeBatchIncomplete
	}
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// JetStream API error codes this package reacts to (nats-server's
// server/errors.json).
const (
	errCodeClusterNoPeers        = 10005 // no suitable peers for placement
	errCodeInsufficientResources = 10023
	errCodeStoreFailed           = 10077 // "maximum bytes exceeded" among others
	errCodeBatchIncomplete       = 10176
	errCodeBatchDuplicate        = 10201 // a batch with an id already stored: committed before
	errCodeDuplicateInProcess    = 10158
	errCodeTooManyBatches        = 10210
)
