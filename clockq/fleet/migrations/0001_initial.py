# The hosts and GPU workers registry, their drains, and the checkpoint folder's marker.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name='CheckpointMarker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('token', models.CharField(max_length=64)),
                ('written_by', models.CharField(max_length=63)),
                ('written_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.CreateModel(
            name='Host',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('drained_at', models.DateTimeField(blank=True, null=True)),
                ('drained_by', models.CharField(blank=True, default='', max_length=150)),
                ('drain_reason', models.CharField(blank=True, default='', max_length=300)),
                ('name', models.CharField(max_length=63, unique=True)),
                ('roles', models.JSONField(blank=True, default=list)),
                ('broker', models.CharField(blank=True, default='', max_length=300)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('seen_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='GpuWorker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('drained_at', models.DateTimeField(blank=True, null=True)),
                ('drained_by', models.CharField(blank=True, default='', max_length=150)),
                ('drain_reason', models.CharField(blank=True, default='', max_length=300)),
                ('name', models.CharField(max_length=130, unique=True)),
                ('gpu_index', models.IntegerField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('host', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='gpu_workers', to='fleet.host')),
            ],
            options={
                'verbose_name': 'GPU worker',
                'ordering': ['host__name', 'gpu_index'],
            },
        ),
    ]
