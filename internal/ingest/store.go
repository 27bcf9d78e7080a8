package ingest

import (
	"context"
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Fleet mode (issue 22): a request's records go through Config.Store
// (storage.Appender) instead of a spool lane. The local path (handler.go)
// is untouched but for the branch that comes here.

// appendStore builds st.req's records (as the spool path does: the event
// rewritten with its insert_id, time and client address) and appends them
// through the store; 200 only after Append returned nil, 503 with
// Retry-After otherwise (never a partial 200: the store is all or nothing).
func (s *Server) appendStore(ctx *fasthttp.RequestCtx, p pathIdx, st *reqState, rawLen, bodyLen int) {
	n := len(st.req.Events)
	now := s.cfg.Now()
	nowMS := now.UnixMilli()
	// One allocation for every record's bytes: records are cut from it
	// once it is complete (appending could move it).
	buf := make([]byte, 0, bodyLen+recordSlack*n)
	type span struct{ key, data [2]int }
	spans := make([]span, n)
	for i := range st.req.Events {
		ev := &st.req.Events[i]
		sp := &spans[i]
		sp.key[0] = len(buf)
		buf = ev.OrderKey(buf)
		sp.key[1] = len(buf)
		sp.data[0] = len(buf)
		if s.anonIP && ev.HasGivenIP() {
			st.ev = ev.AppendRewritten(st.ev[:0], s.ids, nowMS, st.ip)
			buf = event.AppendIPsReplaced(buf, st.ev, appendAnonymizedIP)
		} else {
			buf = ev.AppendRewritten(buf, s.ids, nowMS, st.ip)
		}
		sp.data[1] = len(buf)
	}
	recs := make([]spool.Record, n)
	for i := range recs {
		sp := &spans[i]
		recs[i] = spool.Record{
			OrderKey: buf[sp.key[0]:sp.key[1]:sp.key[1]],
			UserID:   st.req.Events[i].UserID,
			Data:     buf[sp.data[0]:sp.data[1]:sp.data[1]],
		}
	}
	if s.testHook != nil {
		s.testHook(ctx)
	}
	req := storage.Request{
		ID:       s.store.Next(),
		Lane:     spool.LaneKey{Kind: spool.KindEvents, APIKey: string(st.req.APIKey), Options: string(st.req.Options)},
		Accepted: now,
		Records:  recs,
	}
	if err := s.cfg.Store.Append(s.base, req); err != nil {
		s.storeFailed(ctx, p, err, n)
		return
	}
	s.m.accepted.Add(float64(n))
	b := append(st.out[:0], `{"code":200,"events_ingested":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"payload_size_bytes":`...)
	b = strconv.AppendInt(b, int64(rawLen), 10)
	b = append(b, `,"server_upload_time":`...)
	b = strconv.AppendInt(b, nowMS, 10)
	b = append(b, '}')
	st.out = b
	ctx.SetContentTypeBytes(jsonContentType)
	ctx.SetBody(b)
}

// storeFailed answers a request the store did not take: 503 with
// Retry-After in every case (the client retries; the upstream deduplicates
// a request stored after all by its insert_ids).
func (s *Server) storeFailed(ctx *fasthttp.RequestCtx, p pathIdx, err error, n int) {
	switch {
	case errors.Is(err, storage.ErrFull):
		s.unavailable(ctx, p, "Spool full, retry later", reasonSpoolFull, n)
	case errors.Is(err, context.Canceled), errors.Is(err, storage.ErrLost), s.closing.Load():
		s.unavailable(ctx, p, "Service is shutting down", reasonShuttingDown, n)
	default:
		s.unavailable(ctx, p, "Service unavailable", reasonSpoolError, n)
		s.log.Error("store append failed", zap.Int("events", n), zap.Error(err))
	}
}
