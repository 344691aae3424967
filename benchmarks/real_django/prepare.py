"""Make the benchmark site for the running interpreter, once: `wagtail start` a project in
.site-X.Y, migrate SQLite, collect static files, create the admin user, build a content tree of 30
pages (a home page, 8 standard pages with StreamField bodies, a blog index, 20 blog posts with
tags, images and rich text with page links and embedded images), index it for search, render
every page and admin screen once (so the image renditions exist before any server starts) and
write paths.json: the public, admin and static paths the load sends, each checked to answer 200.

    benchmarks/real_django/.venv-3.12/bin/python benchmarks/real_django/prepare.py [--force]

run.py calls it when .site-X.Y/paths.json is missing.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

HERE = Path(__file__).resolve().parent
SITE_DIR = HERE / f".site-{sys.version_info[0]}.{sys.version_info[1]}"
USERNAME, PASSWORD = "admin", "bench-admin-password"
SEED = 21

WORDS = [
    "memory", "worker", "request", "page", "share", "fork", "copy", "heap", "object", "python", "django",
    "wagtail", "server", "process", "garden", "river", "mountain", "coffee", "library", "museum", "concert",
    "harbour", "market", "festival", "engine", "station", "bridge", "school", "theatre", "journal", "report",
    "season", "summer", "winter", "autumn", "spring", "design", "service", "people", "community", "project",
    "history", "future", "science", "music", "travel", "city",
]
TAGS = ["news", "events", "python", "memory", "travel", "music", "science", "community"]


def sentence(rng: random.Random, n: int = 12) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, sentences: int = 5) -> str:
    return " ".join(sentence(rng, rng.randint(8, 18)) for _ in range(sentences))


def make_project() -> None:
    if (SITE_DIR / "benchsite").exists():
        return
    SITE_DIR.mkdir(exist_ok=True)
    wagtail = Path(sys.executable).parent / "wagtail"
    subprocess.run([str(wagtail), "start", "benchsite", str(SITE_DIR)], check=True)
    migrations = SITE_DIR / "bench_pages_migrations"
    migrations.mkdir(exist_ok=True)
    (migrations / "__init__.py").touch()


def make_image(rng: random.Random, i: int) -> bytes:
    from PIL import Image as PILImage
    from PIL import ImageDraw

    w, h = 1600, 1067
    img = PILImage.new("RGB", (w, h))
    draw = ImageDraw.Draw(img)
    c1 = [rng.randint(0, 255) for _ in range(3)]
    c2 = [rng.randint(0, 255) for _ in range(3)]
    for y in range(h):
        t = y / h
        draw.line([(0, y), (w, y)], fill=tuple(int(a + (b - a) * t) for a, b in zip(c1, c2, strict=True)))
    for _ in range(40):
        x, y, r = rng.randint(0, w), rng.randint(0, h), rng.randint(20, 200)
        draw.ellipse([x - r, y - r, x + r, y + r], fill=tuple(rng.randint(0, 255) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=85)
    return out.getvalue()


def build_content() -> None:
    from bench_pages.models import BlogIndexPage, BlogPage, StandardPage
    from django.core.files.images import ImageFile
    from wagtail.images.models import Image
    from wagtail.models import Page

    if BlogIndexPage.objects.exists():
        return
    rng = random.Random(SEED)
    images = []
    for i in range(12):
        image = Image(title=f"Picture {i + 1}: {sentence(rng, 3)[:-1]}",
                      file=ImageFile(io.BytesIO(make_image(rng, i)), name=f"picture-{i + 1}.jpg"))
        image.save()
        images.append(image)

    home = Page.objects.get(depth=2).specific

    def publish(parent: Page, page: Page) -> Page:
        parent.add_child(instance=page)
        page.save_revision().publish()
        return page

    def rich(links: list[Page]) -> str:
        parts = []
        for _ in range(rng.randint(3, 6)):
            text = paragraph(rng)
            if links and rng.random() < 0.7:
                target = rng.choice(links)
                text += f' See <a linktype="page" id="{target.id}">{target.title}</a>.'
            parts.append(f"<p>{text}</p>")
        image = rng.choice(images)
        parts.insert(1, f'<embed embedtype="image" id="{image.id}" format="right" alt="{image.title}"/>')
        parts.insert(0, f"<h2>{sentence(rng, 5)[:-1]}</h2>")
        return "".join(parts)

    def stream() -> list[tuple[str, object]]:
        body: list[tuple[str, object]] = []
        for _ in range(rng.randint(3, 5)):
            body.append(("heading", sentence(rng, 4)[:-1]))
            body.append(("paragraph", blocks_rich(f"<p>{paragraph(rng)}</p><p>{paragraph(rng, 3)}</p>")))
            if rng.random() < 0.6:
                body.append(("image", rng.choice(images)))
        body.append(("quote", sentence(rng, 14)))
        return body

    def blocks_rich(html: str) -> object:
        from wagtail.rich_text import RichText

        return RichText(html)

    standard: list[Page] = []
    tops = ["About", "Services", "Visit", "Contact"]
    for title in tops:
        page = publish(home, StandardPage(title=title, intro=f"<p>{paragraph(rng, 2)}</p>", body=stream()))
        standard.append(page)
    for parent, title in [(0, "Team"), (0, "History"), (1, "Consulting"), (2, "Opening hours")]:
        page = publish(standard[parent],
                       StandardPage(title=title, intro=f"<p>{paragraph(rng, 2)}</p>", body=stream()))
        standard.append(page)

    blog = publish(home, BlogIndexPage(title="Blog", intro=f"<p>{paragraph(rng, 2)}</p>"))
    start = datetime.date(2026, 1, 5)
    for i in range(20):
        date = start + datetime.timedelta(days=7 * i)
        post = BlogPage(title=f"{sentence(rng, 5)[:-1]} ({i + 1})", date=date, intro=sentence(rng, 16),
                        body=rich(standard), main_image=rng.choice(images))
        post.tags.add(*rng.sample(TAGS, rng.randint(1, 3)))
        publish(blog, post)
    print(f"content: {Page.objects.filter(depth__gte=2).count()} pages, {Image.objects.count()} images")


STATIC_RE = re.compile(r"""(?:src|href)=["'](/static/[^"'?#]+)""")


def check_paths() -> dict[str, list[str]]:
    """Every path the load sends, each fetched once (renditions made) and checked to answer 200."""
    from bench_pages.models import BlogIndexPage, BlogPage, StandardPage
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse
    from wagtail.images.models import Image
    from wagtail.models import Page

    pages = list(Page.objects.filter(depth__gte=2).live().order_by("path"))
    blog = BlogIndexPage.objects.get()
    public = [p.url for p in pages]
    public += [f"{blog.url}?tag={t}" for t in TAGS[:4]]
    queries = ("memory", "garden river", "python fork", "music")
    public += [f"{reverse('search')}?{urlencode({'query': q})}" for q in queries]

    home = pages[0]
    posts = list(BlogPage.objects.order_by("path"))
    std = list(StandardPage.objects.order_by("path"))
    images = list(Image.objects.order_by("id"))
    admin = [reverse("wagtailadmin_home"), reverse("wagtailadmin_explore_root")]
    admin += [reverse("wagtailadmin_explore", args=[p.id]) for p in (home, blog, std[0])]
    admin += [reverse("wagtailadmin_pages:edit", args=[p.id]) for p in [*posts[::3], *std[::2], blog, home]]
    admin += [reverse("wagtailimages:index"), reverse("wagtailimages_chooser:choose")]
    admin += [reverse("wagtailimages:edit", args=[i.id]) for i in images[:3]]
    admin += [reverse("wagtailadmin_choose_page"), reverse("wagtailadmin_choose_page_child", args=[blog.id])]
    admin += [f"{reverse('wagtailadmin_pages:search')}?{urlencode({'q': q})}" for q in ("memory", "blog")]
    admin += [reverse("wagtailadmin_pages:history", args=[posts[0].id])]

    client = Client()
    client.force_login(get_user_model().objects.get(username=USERNAME))
    static: set[str] = set()
    for path in public + admin:
        resp = client.get(path)
        if resp.status_code != 200:
            sys.exit(f"prepare: GET {path} answered {resp.status_code}")
        if resp.get("Content-Type", "").startswith("text/html"):
            static.update(STATIC_RE.findall(resp.content.decode()))
    static_paths = sorted(static)
    anonymous = Client()
    for path in static_paths:
        resp = anonymous.get(path)  # through WhiteNoise, as the servers serve them
        if resp.status_code != 200:
            sys.exit(f"prepare: GET {path} answered {resp.status_code}")
        b"".join(resp.streaming_content) if resp.streaming else resp.content  # noqa: B018
    return {"public": public, "admin": admin, "static": static_paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true", help="make the site again from scratch")
    args = parser.parse_args()
    if args.force and SITE_DIR.exists():
        shutil.rmtree(SITE_DIR)
    make_project()
    sys.path.insert(0, str(HERE))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("makemigrations", "bench_pages", verbosity=0)
    call_command("migrate", verbosity=0)
    call_command("collectstatic", "--noinput", verbosity=0)
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    if not user_model.objects.filter(username=USERNAME).exists():
        user_model.objects.create_superuser(USERNAME, "admin@example.com", PASSWORD)
    build_content()
    call_command("update_index", verbosity=0)
    paths = check_paths()
    (SITE_DIR / "paths.json").write_text(json.dumps(paths, indent=1))
    print(f"site: {SITE_DIR}; {len(paths['public'])} public, {len(paths['admin'])} admin, "
          f"{len(paths['static'])} static paths")


if __name__ == "__main__":
    main()
