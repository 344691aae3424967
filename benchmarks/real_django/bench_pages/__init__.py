"""The benchmark site's page types: standard pages with a StreamField body, a blog index with tag
filtering, blog posts with tags, a main image and rich text; and the middleware that names the
worker in every response."""
