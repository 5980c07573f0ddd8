package migrations

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestLoadEmbedded(t *testing.T) {
	for _, d := range []Dialect{Postgres, SQLite} {
		ms, err := Load(FS(), d)
		if err != nil || len(ms) == 0 || ms[0].Version != 1 || ms[0].Up == "" || ms[0].Down == "" {
			t.Fatalf("%s: %+v, %v", d, ms, err)
		}
	}
}

func TestLoadPicksDialectFiles(t *testing.T) {
	fsys := fstest.MapFS{
		"0001_base.up.sql":           {Data: []byte("portable up")},
		"0001_base.down.sql":         {Data: []byte("portable down")},
		"0002_audit.postgres.up.sql": {Data: []byte("pg up")},
		"0002_audit.sqlite.up.sql":   {Data: []byte("lite up")},
		"0002_audit.up.sql":          {Data: []byte("portable 2")},
		"README.md":                  {Data: []byte("ignored")},
	}
	pg, err := Load(fsys, Postgres)
	if err != nil || len(pg) != 2 || pg[1].Up != "pg up" || pg[0].Down != "portable down" {
		t.Fatalf("postgres: %+v, %v", pg, err)
	}
	lite, err := Load(fsys, SQLite)
	if err != nil || lite[1].Up != "lite up" {
		t.Fatalf("sqlite: %+v, %v", lite, err)
	}
}

func TestLoadRejectsBadSets(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"gap":         {"0001_a.up.sql": {}, "0003_c.up.sql": {}},
		"two names":   {"0001_a.up.sql": {}, "0001_b.down.sql": {}},
		"no up":       {"0001_a.down.sql": {}},
		"bad name":    {"1_a.up.sql": {}},
		"bad suffix":  {"0001_a.sideways.sql": {}},
		"bad dialect": {"0001_a.mysql.up.sql": {}},
	} {
		if _, err := Load(fsys, Postgres); err == nil || !strings.Contains(err.Error(), "migrations:") {
			t.Errorf("%s: got %v, want an error", name, err)
		}
	}
	if _, err := Load(fstest.MapFS{}, "oracle"); err == nil {
		t.Error("unknown dialect accepted")
	}
}
