package export

import (
	"io"
	"net"
	"time"

	"github.com/svcrelay/relay/internal/forward"
	"github.com/valyala/fasthttp"
)

// DefaultWriteIdleTimeout is the default of Config.WriteIdleTimeout.
const DefaultWriteIdleTimeout = 2 * time.Minute

// ForwardStreaming is fwd.Forward for answers that may take longer to
// stream to the caller than the admin listener's write time-out allows.
// fasthttp's Server.WriteTimeout is a deadline for writing the whole
// answer: a 2 GB export to a caller reading at 5 MB/s needs almost 7
// minutes and would be cut. ForwardStreaming forwards into a scratch
// context, then streams the upstream body to the caller through a reader
// that moves the connection's write deadline to now + idle before every
// chunk: the caller may take as long as it keeps reading, and a caller that
// stops reading for idle is cut. The body is never held in memory; the
// upstream connection is released when the admin listener closes the body.
// DSAR outputs use it too. idle 0 means DefaultWriteIdleTimeout.
func ForwardStreaming(ctx *fasthttp.RequestCtx, fwd *forward.Forwarder, t forward.Target, idle time.Duration) (int, error) {
	if idle <= 0 {
		idle = DefaultWriteIdleTimeout
	}
	var tmp fasthttp.RequestCtx
	tmp.Init(&ctx.Request, ctx.RemoteAddr(), nil)
	status, err := fwd.Forward(&tmp, t)
	ctx.Response.Reset()
	tmp.Response.Header.CopyTo(&ctx.Response.Header)
	body := tmp.Response.BodyStream()
	if body == nil {
		ctx.Response.SetBody(tmp.Response.Body())
		return status, err
	}
	// tmp is never reset: only the admin listener, through rb.Close, ends
	// the stream.
	rb := &renewingBody{r: body, conn: ctx.Conn(), idle: idle}
	ctx.Response.SetBodyStream(rb, tmp.Response.Header.ContentLength())
	return status, err
}

// renewingBody renews the caller connection's write deadline as the body
// is read (the server writes each chunk right after reading it).
type renewingBody struct {
	r       io.Reader
	conn    net.Conn
	idle    time.Duration
	renewAt time.Time
}

func (b *renewingBody) Read(p []byte) (int, error) {
	if now := time.Now(); b.conn != nil && !now.Before(b.renewAt) {
		b.conn.SetWriteDeadline(now.Add(b.idle))
		b.renewAt = now.Add(b.idle / 8) // a syscall per chunk is not needed
	}
	return b.r.Read(p)
}

// Close closes the upstream body (which releases the upstream connection).
func (b *renewingBody) Close() error {
	if c, ok := b.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
