package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/stockade-sh/stockade/client"
)

// The example runs code once and prints its output. It reads the daemon's
// URL and an agent key from the environment, as an agent would;
// TestExample runs it against a real daemon and checks what it prints.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(os.Getenv("STOCKADE_URL"), os.Getenv("STOCKADE_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ex, err := c.CreateExecution(ctx, client.ExecutionRequest{Runtime: "python", Code: "print(6*7)"})
	if err != nil {
		log.Fatal(err)
	}
	if ex.Status == client.StatusAwaitingApproval {
		fmt.Println("waiting for an approver to decide on", ex.ApprovalID)
		if ex, err = c.GetExecution(ctx, ex.ID, time.Minute); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Print(ex.Status, ": ", ex.Result.Stdout)
}
