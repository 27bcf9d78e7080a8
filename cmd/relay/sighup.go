package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"go.uber.org/zap"
)

// watchSIGHUP calls reload on every SIGHUP until the returned stop is
// called; stop waits for a reload in progress. While it watches, SIGHUP no
// longer kills the process (its default), so a `systemctl reload` or a
// stray `kill -HUP` is never an unclean exit.
func watchSIGHUP(reload func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-quit:
				return
			case <-ch:
				reload()
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
		<-exited
	}
}

// reloaders is what a reload (SIGHUP, POST /relay/v1/reload: see
// configReloader) runs: each component that reloads something adds its
// function once it is built; run calls them in the order added with the
// configuration to put in force.
type reloaders struct {
	mu sync.Mutex
	fs []func(config.Config)
}

func (r *reloaders) add(f func(config.Config)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fs = append(r.fs, f)
}

func (r *reloaders) run(cfg config.Config) {
	r.mu.Lock()
	fs := append([]func(config.Config){}, r.fs...)
	r.mu.Unlock()
	for _, f := range fs {
		f(cfg)
	}
}

// reloadFiles puts in force the admin token and the credentials of cfg, the
// configuration a reload puts in force: config.Load has read both files
// again and refused the reload when either was bad (and warned about
// modes). The log shows the new state (names, never a secret).
func reloadFiles(cfg config.Config, log *zap.Logger, setToken func(*admintoken.Token), setCreds func(*credentials.Store)) {
	switch {
	case cfg.Token == nil:
		log.Info("reload: no admin token configured: nothing to reload (a token cannot be added while serving)")
	case cfg.AdminTokenFile == "":
		log.Info("reload: the admin token was given directly (" + cfg.Source("admin-token") + "), not in a file: kept")
	default:
		setToken(cfg.Token)
		log.Info("reload: admin token reloaded", zap.String("file", cfg.AdminTokenFile))
	}
	if cfg.Creds == nil {
		log.Info("reload: no credentials file configured: nothing to reload")
		return
	}
	setCreds(cfg.Creds)
	log.Info("reload: credentials reloaded", zap.String("file", cfg.Credentials), zap.Object("credentials", cfg.Creds))
}
