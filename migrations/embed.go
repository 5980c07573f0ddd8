// Package migrations holds the numbered SQL schema of xiaoclaw's store and a
// small runner that applies it to PostgreSQL or SQLite.
//
// Files are named NNNN_name.up.sql and NNNN_name.down.sql. SQL that both
// databases accept goes in those; where a version needs different SQL per
// database, it ships NNNN_name.postgres.up.sql and NNNN_name.sqlite.up.sql
// (and the .down.sql pair) instead. Versions are applied in order, each in
// its own transaction, and recorded in the schema_migrations table.
//
// The runner is written here rather than taken from goose: goose keeps its
// dialect and file system in package-level state and would add a dependency
// for what is about a hundred lines, and the runner needs only database/sql.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed *.sql
var files embed.FS

// FS returns the embedded migration files.
func FS() fs.FS { return files }
