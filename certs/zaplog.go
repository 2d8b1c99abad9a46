package certs

import (
	"github.com/rs/zerolog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zerologCore is a zapcore.Core that writes certmagic's zap entries as
// zerolog events, so an operator reads one log stream.
type zerologCore struct {
	log zerolog.Logger
	// min is the lowest zerolog level the logger emits, worked out once:
	// certmagic logs several debug lines per handshake and building their
	// fields for a logger that drops them would cost every handshake.
	min    zerolog.Level
	fields []zapcore.Field
}

// newZapLogger returns a zap logger whose entries go to log.
func newZapLogger(log zerolog.Logger) *zap.Logger {
	min := zerolog.Disabled
	for _, l := range []zerolog.Level{zerolog.DebugLevel, zerolog.InfoLevel, zerolog.WarnLevel, zerolog.ErrorLevel} {
		if ev := log.WithLevel(l); ev != nil {
			ev.Discard()
			min = l
			break
		}
	}
	if min == zerolog.Disabled {
		return zap.NewNop()
	}
	return zap.New(&zerologCore{log: log, min: min})
}

func zerologLevel(l zapcore.Level) zerolog.Level {
	switch l {
	case zapcore.DebugLevel:
		return zerolog.DebugLevel
	case zapcore.InfoLevel:
		return zerolog.InfoLevel
	case zapcore.WarnLevel:
		return zerolog.WarnLevel
	case zapcore.ErrorLevel:
		return zerolog.ErrorLevel
	default:
		// DPanic, Panic and Fatal: zap itself panics or exits after
		// writing; the bridge only has to record them loudly.
		return zerolog.ErrorLevel
	}
}

func (c *zerologCore) Enabled(l zapcore.Level) bool { return zerologLevel(l) >= c.min }

func (c *zerologCore) With(fields []zapcore.Field) zapcore.Core {
	clone := *c
	clone.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return &clone
}

func (c *zerologCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zerologCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	ev := c.log.WithLevel(zerologLevel(e.Level))
	if ev == nil {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	if e.LoggerName != "" {
		ev = ev.Str("logger", "certmagic."+e.LoggerName)
	} else {
		ev = ev.Str("logger", "certmagic")
	}
	ev.Fields(enc.Fields).Msg(e.Message)
	return nil
}

func (c *zerologCore) Sync() error { return nil }
