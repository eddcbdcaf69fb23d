"""Test-wide settings: CPU only, quiet MuJoCo deprecation chatter."""

import os
import warnings

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
warnings.filterwarnings('ignore', message='.*settotalmass.*')
