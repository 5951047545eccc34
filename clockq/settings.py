"""clockq settings. Every value comes from the environment; a bad one raises ImproperlyConfigured.

Django reads this module (DJANGO_SETTINGS_MODULE=clockq.settings); the settings themselves are in
clockq/config/, one module per thing they configure, each setting beside the comment that says
what it does. A part imports what it uses of another: each imports `paths` (the umask, VAR_DIR)
before it writes anything under var/, so the order of the lines below does not matter. A secret
(DATABASE_URL, REDIS_URL, SECRET_KEY, ...) may come from a file named by its *_FILE variable.
"""

from clockq.config.api import *  # noqa: F403
from clockq.config.broker import *  # noqa: F403
from clockq.config.database import *  # noqa: F403
from clockq.config.host import *  # noqa: F403
from clockq.config.load_control import *  # noqa: F403
from clockq.config.logins import *  # noqa: F403
from clockq.config.paths import *  # noqa: F403
from clockq.config.programs import *  # noqa: F403
from clockq.config.project import *  # noqa: F403
from clockq.config.slicing import *  # noqa: F403
from clockq.config.storage import *  # noqa: F403
