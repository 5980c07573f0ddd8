package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// migrateCommand applies the embedded schema migrations to Postgres; the
// Helm chart runs it as a pre-install/pre-upgrade Job.
func migrateCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	var dsn string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the database schema migrations (idempotent; safe to run from several replicas)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dsn == "" {
				return &exitError{exitUsage, fmt.Errorf("no database: pass --database-url or set XIAOCLAW_DATABASE_URL")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			store, err := tenancy.OpenPostgres(ctx, dsn)
			if err != nil {
				return &exitError{exitConnect, err}
			}
			defer store.Close()
			if err := store.Migrate(ctx); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			fmt.Fprintln(stdout, "schema is up to date")
			return nil
		},
	}
	cmd.Flags().StringVar(&dsn, "database-url", env("XIAOCLAW_DATABASE_URL"), "Postgres URL (env XIAOCLAW_DATABASE_URL)")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long (e.g. waiting for the database)")
	return cmd
}
