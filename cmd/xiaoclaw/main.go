// Command xiaoclaw is the xiaoclaw operator CLI and the one-process
// development system (`xiaoclaw dev`).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "xiaoclaw",
		Short:         "xiaoclaw: MCP tools of voice devices on an OpenClaw node.invoke bus",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "xiaoclaw:", err)
		os.Exit(1)
	}
}
