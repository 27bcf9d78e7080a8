package main

import (
	"fmt"
	"io"
	"slices"
	"sync/atomic"

	"github.com/svcrelay/relay/internal/operator"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLeveledLogger builds the process logger writing to w (format "":
// console when w is a terminal, else JSON), with the level it set and a
// function that sets its format: a reload changes both (SetLevel,
// setFormat) for every logger derived from this one.
func newLeveledLogger(level, format string, w io.Writer) (*zap.Logger, zap.AtomicLevel, func(format string) error, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, lvl, nil, fmt.Errorf("--log-level: %w", err)
	}
	out := zapcore.Lock(zapcore.AddSync(w))
	core := swapCore{in: new(atomic.Pointer[zapcore.Core])}
	setFormat := func(format string) error {
		enc, err := logEncoder(format, w)
		if err != nil {
			return err
		}
		c := zapcore.NewCore(enc, out, lvl)
		core.in.Store(&c)
		return nil
	}
	if err := setFormat(format); err != nil {
		return nil, lvl, nil, err
	}
	return zap.New(core, zap.ErrorOutput(out)), lvl, setFormat, nil
}

// logEncoder is the encoder of --log-format format for output w.
func logEncoder(format string, w io.Writer) (zapcore.Encoder, error) {
	if format == "" {
		format = "json"
		if operator.IsTerminal(w) {
			format = "console"
		}
	}
	ec, enc := zap.NewProductionEncoderConfig(), zapcore.NewJSONEncoder
	switch format {
	case "json":
	case "console":
		ec, enc = zap.NewDevelopmentEncoderConfig(), zapcore.NewConsoleEncoder
	default:
		return nil, fmt.Errorf("--log-format %q: want json or console", format)
	}
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	return enc(ec), nil
}

// swapCore is a zapcore.Core whose core in force (encoder, output, level)
// can be replaced while loggers derived from it log: their fields (With)
// are kept here and written before each entry's, as the core's With would.
type swapCore struct {
	in     *atomic.Pointer[zapcore.Core]
	fields []zapcore.Field
}

func (c swapCore) Enabled(l zapcore.Level) bool { return (*c.in.Load()).Enabled(l) }

func (c swapCore) With(fs []zapcore.Field) zapcore.Core {
	return swapCore{in: c.in, fields: append(slices.Clip(c.fields), fs...)}
}

func (c swapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c swapCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	if len(c.fields) > 0 {
		fs = append(slices.Clip(c.fields), fs...)
	}
	return (*c.in.Load()).Write(e, fs)
}

func (c swapCore) Sync() error { return (*c.in.Load()).Sync() }

// errField logs an error as its message only (zap.Error adds stack-like
// "errorVerbose" fields for some error types).
func errField(err error) zap.Field { return zap.String("error", err.Error()) }
