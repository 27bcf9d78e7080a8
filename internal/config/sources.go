package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Where each setting came from: Load records a Setting per
// option, validation errors name the source of the bad value.

// Setting is one option's effective value and where it came from.
type Setting struct {
	Name   string // the flag name, e.g. "ingest-url"
	Value  string // as given; a secret's value is Masked, a URL's password too
	Origin Origin
}

// Masked replaces a secret's value in Setting.Value.
const Masked = "<masked>"

// Origin is where a setting's value came from: "default", "flag",
// "variable" or "file" (with File and Line).
type Origin struct {
	Kind string
	File string // Kind "file": the YAML file
	Line int    // Kind "file": the line of the key
}

func (o Origin) describe(name string) string {
	switch {
	case o.Kind == "flag":
		return "flag --" + name
	case o.Kind == "variable":
		return "variable " + EnvName(name)
	case o.Kind == "file":
		return fmt.Sprintf("%s line %d", o.File, o.Line)
	}
	return "default"
}

// Source is where name's value came from, e.g. "flag --sync",
// "variable RELAY_SYNC", "/etc/relay/relay.yaml line 12" or "default".
func (c Config) Source(name string) string {
	for _, s := range c.Settings {
		if s.Name == name {
			return s.Origin.describe(name)
		}
	}
	return "default"
}

// SettingError is a validation error about one or more settings; Load
// rewrites it to name where each bad value came from.
type SettingError struct {
	Names []string // flag names, e.g. "max-batch-events"
	Msg   string   // what is wrong, without the setting's name
}

func (e *SettingError) Error() string { return "--" + e.Names[0] + sep(e.Msg) + e.Msg }

// sep is the space between a setting's name and msg, none before a colon.
func sep(msg string) string {
	if strings.HasPrefix(msg, ":") {
		return ""
	}
	return " "
}

func settingErr(name, format string, args ...any) error {
	return &SettingError{Names: []string{name}, Msg: fmt.Sprintf(format, args...)}
}

// withSources rewrites a *SettingError to name each setting's source, never
// a flag that was not given: "max-batch-events 2000 is above 1999 (from
// relay.yaml line 3)", "--sync "x": want always or none (from flag --sync)".
func (c Config) withSources(err error) error {
	var se *SettingError
	if !errors.As(err, &se) {
		return err
	}
	from := make([]string, 0, len(se.Names))
	for _, n := range se.Names {
		src := c.Source(n)
		if len(se.Names) > 1 {
			src = n + " from " + src
		}
		from = append(from, src)
	}
	return fmt.Errorf("%s%s%s (from %s)", c.label(se.Names[0]), sep(se.Msg), se.Msg, strings.Join(from, "; "))
}

// label is how an error calls a setting: "--name" when it was given as a
// flag, else its bare name (its source follows in the error).
func (c Config) label(name string) string {
	if strings.HasPrefix(c.Source(name), "flag ") {
		return "--" + name
	}
	return name
}

// MaskURL hides the password of a URL with user information; other values
// are returned as they are.
func MaskURL(v string) string {
	u, err := url.Parse(v)
	if err != nil || u.User == nil || u.Host == "" {
		return v
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
		return u.String()
	}
	return v
}
