package main

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger builds the process logger writing to w. format "" means console
// when w is a terminal and JSON otherwise.
func newLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	l, _, err := newLeveledLogger(level, format, w)
	return l, err
}

// newLeveledLogger is newLogger, with the level it set: a reload changes
// it (SetLevel) for every logger derived from this one.
func newLeveledLogger(level, format string, w io.Writer) (*zap.Logger, zap.AtomicLevel, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, lvl, fmt.Errorf("--log-level: %w", err)
	}
	if format == "" {
		format = "json"
		if isTerminal(w) {
			format = "console"
		}
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		ec.EncodeDuration = zapcore.StringDurationEncoder
		enc = zapcore.NewJSONEncoder(ec)
	case "console":
		ec := zap.NewDevelopmentEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		ec.EncodeDuration = zapcore.StringDurationEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	default:
		return nil, lvl, fmt.Errorf("--log-format %q: want json or console", format)
	}
	core := zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core, zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), lvl, nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// errField logs an error as its message only (zap.Error adds stack-like
// "errorVerbose" fields for some error types).
func errField(err error) zap.Field { return zap.String("error", err.Error()) }
