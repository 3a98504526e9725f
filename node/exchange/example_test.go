package exchange_test

import (
	"fmt"

	"github.com/pspnode/pspnode/node/exchange"
)

// Parse reads --exchange. Bad input is an error the CLI reports as
// a usage error.
func ExampleParse() {
	for _, s := range []string{"gossip", "epidemic:4", "epidemic:0", "epidemic:four"} {
		ex, err := exchange.Parse(s)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(ex)
	}
	// Output:
	// gossip
	// epidemic:4
	// error: "epidemic:0": S must be a whole number >= 1 (peers each model goes to), e.g. epidemic:4
	// error: "epidemic:four": S must be a whole number >= 1 (peers each model goes to), e.g. epidemic:4
}
