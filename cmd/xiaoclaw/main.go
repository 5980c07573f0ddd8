// Command xiaoclaw is the xiaoclaw operator CLI and the one-process
// development system (`xiaoclaw dev`).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/admincmd"
	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/auditcmd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run executes the CLI and returns the process exit code.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	root := newRoot(env, stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "xiaoclaw:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return exitUsage
	}
	return exitOK
}

func newRoot(env func(string) string, stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "xiaoclaw",
		Short:         "xiaoclaw: MCP tools of voice devices on an OpenClaw node.invoke bus",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(operatorCommands(env, stdout)...)
	root.AddCommand(loadCommand(env, stdout), devCommand(env, stdout), simCommand(env, stdout), agentCommand(env, stdout))
	root.AddCommand(admincmd.CommandsWithEnv(env)...)
	root.AddCommand(migrateCommand(env, stdout), auditcmd.CommandWithEnv(env), upstreamCommand(env, stdout), mcpCommand(env))
	return root
}
