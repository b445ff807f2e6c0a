package image

import (
	"context"

	"github.com/stockade-sh/stockade/errdefs"
)

// installWheels installs the template's python wheels into the tree.
func (b *templateBuild) installWheels(ctx context.Context, rootfs string) ([]TemplateWheel, error) {
	return nil, errdefs.Publicf("python_wheels: this build of stockade cannot install wheels yet: %w", errdefs.ErrFailedPrecondition)
}

// installNPM installs the template's npm packages into the tree.
func (b *templateBuild) installNPM(ctx context.Context, rootfs string) ([]TemplateNPM, error) {
	return nil, errdefs.Publicf("npm_packages: this build of stockade cannot install npm packages yet: %w", errdefs.ErrFailedPrecondition)
}
