"""Page types of the benchmark site, written the way Wagtail's own tutorial writes them."""

from __future__ import annotations

from django.db import models
from modelcluster.contrib.taggit import ClusterTaggableManager
from modelcluster.fields import ParentalKey
from taggit.models import TaggedItemBase
from wagtail import blocks
from wagtail.admin.panels import FieldPanel, MultiFieldPanel
from wagtail.fields import RichTextField, StreamField
from wagtail.images.blocks import ImageChooserBlock
from wagtail.models import Page
from wagtail.search import index


class StandardPage(Page):
    intro = RichTextField(blank=True)
    body = StreamField(
        [
            ("heading", blocks.CharBlock(form_classname="title")),
            ("paragraph", blocks.RichTextBlock()),
            ("image", ImageChooserBlock()),
            ("quote", blocks.BlockQuoteBlock()),
        ],
        blank=True,
    )

    content_panels = [*Page.content_panels, FieldPanel("intro"), FieldPanel("body")]
    search_fields = [*Page.search_fields, index.SearchField("intro"), index.SearchField("body")]


class BlogIndexPage(Page):
    intro = RichTextField(blank=True)

    content_panels = [*Page.content_panels, FieldPanel("intro")]
    subpage_types = ["bench_pages.BlogPage"]

    def get_context(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        context = super().get_context(request, *args, **kwargs)
        posts = BlogPage.objects.child_of(self).live().order_by("-date").select_related("main_image")
        tag = request.GET.get("tag")
        if tag:
            posts = posts.filter(tags__name=tag)
        context["posts"] = posts
        context["tag"] = tag
        return context


class BlogPageTag(TaggedItemBase):
    content_object = ParentalKey(
        "bench_pages.BlogPage", related_name="tagged_items", on_delete=models.CASCADE
    )


class BlogPage(Page):
    date = models.DateField("post date")
    intro = models.CharField(max_length=250)
    body = RichTextField(blank=True)
    main_image = models.ForeignKey(
        "wagtailimages.Image", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tags = ClusterTaggableManager(through=BlogPageTag, blank=True)

    search_fields = [*Page.search_fields, index.SearchField("intro"), index.SearchField("body")]
    content_panels = [
        *Page.content_panels,
        MultiFieldPanel([FieldPanel("date"), FieldPanel("tags")], heading="Blog information"),
        FieldPanel("intro"),
        FieldPanel("body"),
        FieldPanel("main_image"),
    ]
    parent_page_types = ["bench_pages.BlogIndexPage"]
