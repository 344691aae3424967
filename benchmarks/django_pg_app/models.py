"""Two tables; benchmarks/django_pg.py creates and fills them with SQL (no migrations)."""

from django.db import models


class Author(models.Model):
    name = models.CharField(max_length=100)
    bio = models.TextField()

    class Meta:
        app_label = "django_pg_app"


class Article(models.Model):
    author = models.ForeignKey(Author, on_delete=models.CASCADE)
    title = models.CharField(max_length=200)
    summary = models.TextField()
    published = models.DateTimeField()
    views = models.IntegerField()

    class Meta:
        app_label = "django_pg_app"
