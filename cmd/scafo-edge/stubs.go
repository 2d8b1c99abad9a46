package main

import (
	"context"
	"errors"
	"io"
)

func routesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("routes: not yet")
}
