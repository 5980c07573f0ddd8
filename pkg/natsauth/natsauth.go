// Package natsauth is how a service process authenticates to NATS: the
// flags every service main registers for a user and password, an nkey seed
// file or a credentials file, turned into nats.Options. The mains read the
// flags' environment variables (XIAOCLAW_NATS_USER for --nats-user, …) the
// way they read every flag's. Production NATS gives each service its
// own user with subject permissions (deploy/helm, docs/deploy.md).
package natsauth

import (
	"errors"
	"flag"

	"github.com/nats-io/nats.go"
)

// Environment variables of the flags (XIAOCLAW_ and the flag name in upper
// snake case), for clients that fill Credentials from the environment.
const (
	EnvUser     = "XIAOCLAW_NATS_USER"
	EnvPassword = "XIAOCLAW_NATS_PASSWORD"
	EnvNKeySeed = "XIAOCLAW_NATS_NKEY_SEED"
	EnvCreds    = "XIAOCLAW_NATS_CREDS"
)

// InboxPrefix is the reply-subject prefix of a service user, "_INBOX_<user>":
// the server lets each user subscribe to its own replies only
// (deploy/helm's permissions), so no service reads another's.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// Credentials of one NATS client: a user with a password, an nkey seed
// file, or a credentials file (JWT and seed; operator mode). At most one.
type Credentials struct {
	User, Password string
	NKeySeedFile   string
	CredsFile      string
}

// Register adds --nats-user, --nats-password, --nats-nkey-seed and
// --nats-creds to fs, defaulting to c's values. Prefer the environment or a
// file for secrets: a flag shows in the process list.
func (c *Credentials) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.User, "nats-user", c.User, "NATS user, with --nats-password (env "+EnvUser+")")
	fs.StringVar(&c.Password, "nats-password", c.Password, "NATS password of --nats-user (env "+EnvPassword+")")
	fs.StringVar(&c.NKeySeedFile, "nats-nkey-seed", c.NKeySeedFile, "file holding this service's NATS nkey seed (SU…) (env "+EnvNKeySeed+")")
	fs.StringVar(&c.CredsFile, "nats-creds", c.CredsFile, "NATS credentials file, JWT and seed (env "+EnvCreds+")")
}

// FromEnv returns the credentials the environment names (getenv, e.g.
// os.Getenv), for a client whose flags do not read it themselves.
func FromEnv(getenv func(string) string) Credentials {
	return Credentials{User: getenv(EnvUser), Password: getenv(EnvPassword),
		NKeySeedFile: getenv(EnvNKeySeed), CredsFile: getenv(EnvCreds)}
}

// Options returns the nats.Options that present the credentials (with a
// user, also its InboxPrefix); none when no credentials are set (a URL with
// user:password@ still works).
func (c Credentials) Options() ([]nats.Option, error) {
	n := 0
	for _, set := range []bool{c.User != "" || c.Password != "", c.NKeySeedFile != "", c.CredsFile != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return nil, errors.New("NATS credentials: give one of --nats-user/--nats-password, --nats-nkey-seed and --nats-creds")
	case c.User != "" || c.Password != "":
		if c.User == "" || c.Password == "" {
			return nil, errors.New("NATS credentials: --nats-user and --nats-password go together")
		}
		return []nats.Option{nats.UserInfo(c.User, c.Password), nats.CustomInboxPrefix(InboxPrefix(c.User))}, nil
	case c.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, err
		}
		return []nats.Option{opt}, nil
	case c.CredsFile != "":
		return []nats.Option{nats.UserCredentials(c.CredsFile)}, nil
	}
	return nil, nil
}
